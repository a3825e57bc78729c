"""Live scores as evidence (`gate.live_split`): the tests themselves, the gate's combined verdict,
and the learner's split: begun when verdicts run to their last look undecided STALLED_VERDICTS
times in a row against one head, their candidates not behind on the tasks, the canary then
serving the split's fraction, the line's and the serving release's scores over the same time
handed to the gate with the next candidate, and the split ended when the head moves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from statistics import NormalDist
from typing import Callable, Mapping

import pytest

from reef.commit.gate import WeightsGate, paired_verdict, sequential_verdict
from reef.config import GateConfig, ServeConfig
from reef.core.live_evidence import LiveEvidence, ScoreSummary, combined_p, sign_test_z, tasks_share_p, two_sample_z
from reef.core.sign_test import sign_test_p
from reef.core.types import Record, ReleaseRef, Report, ReportedRecords
from reef.grow.canary import MIN_SPLIT_SCORES, SPLIT_WINDOW, STALLED_VERDICTS, LiveScores, canary_release_id
from tests.test_gate import Grader, pairs, twelve_tasks
from tests.test_learner import PROMISING, Rig, ScriptedGate, run_with_rig, until


def reported(scores: list[tuple[str, float]], at: Callable[[int], float] = lambda i: 0.0) -> list[ReportedRecords]:
    """One reported record a (release id, score), reported at `at(i)`, as the learner reads them."""
    return [
        ReportedRecords(
            Report(f"rep{i}", "s", (f"rec{i}",), score, created_at=at(i), seq=i),
            (Record(f"rec{i}", "s", ReleaseRef(release, release, "load"), {}),),
        )
        for i, (release, score) in enumerate(scores)
    ]


def evidence(line: list[float], serving: list[float], serving_id: str = "r0") -> LiveEvidence:
    return LiveEvidence(ScoreSummary.of(line), ScoreSummary.of(serving), serving_id)


def test_the_tests_behind_live_evidence() -> None:
    for wins, losses in [(4, 1), (5, 1), (6, 2), (3, 3), (2, 5), (9, 3)]:  # the approximation follows the exact test
        approx = 1 - NormalDist().cdf(sign_test_z(wins, losses))
        assert approx == pytest.approx(sign_test_p(wins, losses), abs=0.02)
    assert sign_test_z(0, 0) == 0.0  # no discordant task: no evidence either way
    same = ScoreSummary.of([1.0, 0.0] * 20)
    assert two_sample_z(same, same) == 0.0 and two_sample_z(ScoreSummary.of([1.0]), same) == 0.0  # under 2: none
    assert two_sample_z(ScoreSummary.of([1.0] * 9 + [0.0]), ScoreSummary.of([1.0] * 5 + [0.0] * 5)) > 2
    assert two_sample_z(ScoreSummary.of([1.0] * 4), ScoreSummary.of([0.0] * 4)) == 8.0  # no spread: capped, finite
    ahead = evidence([1.0] * 90 + [0.0] * 10, [1.0] * 80 + [0.0] * 20)
    assert ahead.z() > 1 and ahead.to_json()["line_n"] == 100
    # one test of both: a 4-1 on the tasks is p 0.19 alone, under 0.15 with the line ahead live
    assert combined_p(4, 1, ahead) < 0.15 < sign_test_p(4, 1)
    assert combined_p(4, 1, evidence([1.0, 0.0] * 50, [1.0, 0.0] * 50)) > sign_test_p(4, 1)  # a tie live dilutes


def test_live_evidence_joins_the_verdict_but_the_tasks_bring_half_of_it() -> None:
    config = GateConfig(confidence=0.8, looks=3)  # the last look selects at p <= 0.15
    ahead = evidence([1.0] * 90 + [0.0] * 10, [1.0] * 80 + [0.0] * 20)
    alone = sequential_verdict(*pairs(4, 1, 87), config, look=3, looks=3)
    assert alone is not None and alone.decision == "reject" and "live" not in alone.metrics
    both = sequential_verdict(*pairs(4, 1, 87), config, look=3, looks=3, live=ahead)
    assert both is not None and both.decision == "select"
    assert both.metrics["p_tasks"] == pytest.approx(sign_test_p(4, 1)) and both.metrics["live"]["z"] == ahead.z()
    lying = evidence([1.0] * 100, [0.0] * 100)  # a client that scores the line 1 and the serving release 0
    assert lying.z() == 8.0
    for wins, losses in [(0, 0), (1, 0), (2, 2), (4, 3), (2, 3)]:  # level with the head on the tasks, or behind
        assert paired_verdict(*pairs(wins, losses, 80), 0.0, 0.85, live=lying).decision == "reject", (wins, losses)
    for wins, losses in [(2, 0), (3, 1), (5, 3)]:  # leaning towards it: p 0.25-0.36 alone, under sqrt(0.15)
        assert sign_test_p(wins, losses) <= tasks_share_p(0.15) < 0.5
        assert paired_verdict(*pairs(wins, losses, 80), 0.0, 0.85, live=ahead).decision == "select", (wins, losses)
    behind = evidence([1.0] * 75 + [0.0] * 25, [1.0] * 90 + [0.0] * 10)
    assert sequential_verdict(*pairs(6, 2, 84), config, look=3, looks=3).decision == "select"  # type: ignore[union-attr]
    assert sequential_verdict(*pairs(6, 2, 84), config, look=3, looks=3, live=behind).decision == "reject"  # type: ignore[union-attr]
    assert sequential_verdict(*pairs(5, 5, 20), config, look=1, looks=3, live=ahead) is None  # early: look further


def two_tasks_scorer(task: dict, text: str) -> float:
    """Only tasks 0 and 1 can be answered right: a candidate answering "right" wins 2-0, 10 ties."""
    return float(text == "right" and task["prompt"] in ("Tell me about 0.", "Tell me about 1."))


def test_the_gate_takes_live_evidence_only_of_the_release_it_judges_against(tmp_path: Path) -> None:
    config = GateConfig(
        tasks=str(twelve_tasks(tmp_path)), scorer="tests.test_live_evidence:two_tasks_scorer", looks=1
    )  # selects at p <= 0.2; the tasks alone: 2-0 is p 0.25
    base = ReleaseRef("r0", "sha256:base", "load:sha256:base")
    ahead = evidence([1.0] * 60 + [0.0] * 4, [1.0] * 40 + [0.0] * 24)

    async def run(live: LiveEvidence | None, candidate: str = "sha256:good") -> dict:
        gate = WeightsGate(config, Grader(), worker=None)  # type: ignore[arg-type]
        verdict = await gate.judge(base, {}, candidate, {}, [], live=live)
        return {"decision": verdict.decision, **verdict.metrics}

    assert asyncio.run(run(None))["decision"] == "reject"  # 2-0 alone is not enough
    judged = asyncio.run(run(ahead))
    assert judged["decision"] == "select" and (judged["wins"], judged["ties"]) == (2, 10)
    assert judged["live"]["serving_n"] == 64
    stale = asyncio.run(run(evidence(ahead_line := [1.0] * 60 + [0.0] * 4, [0.0] * 64, serving_id="r-before")))
    assert ahead_line and stale["decision"] == "reject" and "live" not in stale  # scores of another head: unused
    level = asyncio.run(run(evidence([1.0] * 64, [0.0] * 64), candidate="sha256:same"))  # answers as the base
    assert level["decision"] == "reject" and level["ties"] == 12 and level["live"]["z"] == 8.0  # never a tie


def test_live_split_is_a_fraction_strictly_between_0_and_1() -> None:
    assert ServeConfig.model_validate({"learner": {"gate": {"live_split": 0.5}}}).learner.gate.live_split == 0.5
    assert GateConfig().live_split is None
    for bad in (0, 1, 1.5):
        with pytest.raises(ValueError):
            GateConfig(live_split=bad)


def test_split_scores_count_only_the_lines_canaries_and_the_serving_release_from_the_split_on() -> None:
    live = LiveScores()
    live.add([], "r0")
    live.start("canary-a")  # before the split: not part of it
    live.begin_split()
    live.start("canary-b")
    live.add(reported([("canary-a", 0.0), ("canary-b", 1.0), ("r0", 0.0)] * MIN_SPLIT_SCORES), "r0")
    found = live.evidence()
    assert found is not None and found.line.n == found.serving.n == MIN_SPLIT_SCORES
    assert found.line.mean == 1.0 and found.serving.mean == 0.0 and found.serving_release_id == "r0"
    assert live.summary()["split_scores"] == [MIN_SPLIT_SCORES, MIN_SPLIT_SCORES]
    live.begin_split()  # the line was dropped: the new one starts again, beside the same head
    assert live.split and live.evidence() is None
    live.start("canary-c")
    live.add(reported([("canary-c", 1.0), ("r0", 0.0)] * (MIN_SPLIT_SCORES - 1)), "r0")
    assert live.evidence() is None  # under MIN_SPLIT_SCORES of each
    live.add(reported([("canary-c", 1.0), ("r0", 0.0)]), "r0")
    assert live.evidence() is not None
    live.add([], "r1")  # the head moved: the split is over
    assert not live.split and live.evidence() is None and not live.line_split


def test_split_scores_are_kept_bounded_and_compared_over_the_time_both_sides_cover() -> None:
    live = LiveScores()
    live.add([], "r0")
    live.begin_split()
    live.start("canary-a")
    live.add(reported([("canary-a", 1.0)] * MIN_SPLIT_SCORES, at=float), "r0")  # the line early on, at 0..31
    # then the serving release more than its window holds, at 100..: its oldest 10 go
    live.add(reported([("r0", 0.0)] * (SPLIT_WINDOW + 10), at=lambda i: 100.0 + i), "r0")
    live.add(reported([("canary-a", 0.0)] * MIN_SPLIT_SCORES, at=lambda i: 5000.0 + i), "r0")
    assert len(live.serving_split) == SPLIT_WINDOW  # bounded
    found = live.evidence()
    assert found is not None and found.serving.n == SPLIT_WINDOW
    assert found.line.n == MIN_SPLIT_SCORES and found.line.mean == 0.0  # not the line's scores from before 110


class FractionCanary:
    """Records the fraction each canary started with."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.started: list[tuple[str, float]] = []

    async def start(self, batch_id: str, files: Mapping[str, bytes]) -> str:
        self.started.append((batch_id, self.fraction))
        return canary_release_id(batch_id)

    async def stop(self) -> None:
        return None


UNDECIDED = {
    "wins": 4,
    "losses": 3,
    "p_worse": sign_test_p(3, 4),
    "early": False,
}  # ran to its last look, ahead, not enough
BEHIND = {**PROMISING, "early": False}  # ran to its last look behind on the tasks, not surely worse


def test_an_undecided_last_look_splits_the_traffic_and_the_lines_live_scores_reach_the_next_verdict(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    async def body(rig: Rig) -> None:
        canary = FractionCanary(1.0)
        gate = ScriptedGate(
            *[("reject", UNDECIDED)] * STALLED_VERDICTS,
            ("reject", PROMISING),
            ("select", PROMISING),
            ("reject", PROMISING),
        )
        learner = rig.learner(gate, canary, live_split=0.25)
        head = rig.chain.head().release_id
        for judged in range(1, STALLED_VERDICTS + 1):
            assert not learner.live.split  # not before the tasks have stalled STALLED_VERDICTS times in a row
            await rig.feed(4)
            await learner.step()
            await until(lambda: len(gate.judged) == judged and learner._gate_idle(), f"candidate {judged} judged")
        assert learner.live.split and learner.status()["canary"]["split"] is True
        gate.hold.clear()
        await rig.feed(4)
        await learner.step()
        await until(
            lambda: len(canary.started) == STALLED_VERDICTS + 1 and learner.waiting is None, "the next at the gate"
        )
        split_canary = canary.started[-1][0]
        assert [f for _, f in canary.started] == [1.0] * STALLED_VERDICTS + [0.25]  # the line now shares the traffic
        await rig.feed(MIN_SPLIT_SCORES, score=lambda i: 0.0)  # the head, beside it
        await rig.feed(MIN_SPLIT_SCORES, score=lambda i: 1.0, release_id=canary_release_id(split_canary))
        await learner.step()  # reads them; the next candidate waits behind the one at the gate
        gate.hold.set()
        n = STALLED_VERDICTS + 2
        await until(lambda: len(gate.judged) == n and learner._gate_idle(), "the two after the split judged")
        assert gate.live[:-1] == [None] * (n - 1)  # none before the split had its scores
        handed = gate.live[-1]
        assert handed is not None and handed.serving_release_id == head
        assert (handed.line.n, handed.line.mean) == (MIN_SPLIT_SCORES, 1.0)
        # the head's since the split began: the batch that made the candidate (two 1s of four), then the 0s
        assert (handed.serving.n, handed.serving.mean) == (
            MIN_SPLIT_SCORES + 4,
            pytest.approx(2 / (MIN_SPLIT_SCORES + 4)),
        )
        assert rig.chain.head().release_id != head and not learner.live.split  # published: the split is over
        await rig.feed(4)
        await learner.step()
        await until(lambda: len(canary.started) == n + 1, "the next candidate's canary")
        assert canary.started[-1][1] == 1.0  # learner.canary's fraction again

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_without_live_split_an_undecided_verdict_changes_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        canary, gate = FractionCanary(1.0), ScriptedGate(*[("reject", UNDECIDED)] * (STALLED_VERDICTS + 1))
        learner = rig.learner(gate, canary)
        for _ in range(STALLED_VERDICTS + 1):
            await rig.feed(4)
            await learner.step()
            await until(lambda: learner._gate_idle() and learner.waiting is None, "the verdict")
        assert not learner.live.split and {f for _, f in canary.started} == {1.0} and set(gate.live) == {None}

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_verdicts_behind_on_the_tasks_never_start_the_split(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        tie = {"wins": 2, "losses": 2, "p_worse": sign_test_p(2, 2), "early": False}
        canary = FractionCanary(1.0)
        gate = ScriptedGate(*[("reject", BEHIND)] * (STALLED_VERDICTS + 1), *[("reject", tie)] * STALLED_VERDICTS)
        learner = rig.learner(gate, canary, live_split=0.25)
        for judged in range(1, 2 * STALLED_VERDICTS + 2):
            await rig.feed(4)
            await learner.step()
            await until(lambda: len(gate.judged) == judged and learner._gate_idle(), f"candidate {judged} judged")
            # a line behind is not served to more of the traffic; ties count, as at a ceiling
            assert learner.live.split is (judged == 2 * STALLED_VERDICTS + 1)
        assert learner.working is not None  # each was trained on from: behind, but not surely worse

    run_with_rig(tmp_path, tiny_model_dir, body)
