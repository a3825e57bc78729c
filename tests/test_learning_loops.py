"""Each of the learner's three loops driven alone (docs/architecture.md, "The three loops"):
the gate's lane fed its queue of candidates, the canary loop fed candidates and reports, and
the training loop feeding the lane's queue while the gate holds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Mapping

from reef.commit.gate_lane import GateLane, Outcome, Queued
from reef.core.learned import LearnedCandidate
from reef.core.types import Record, RecordStatus, ReleaseRef, Report, ReportedRecords, Verdict
from reef.grow.canary import WITHDRAW_BY, CanaryLoop, canary_release_id
from reef.grow.learner_stats import LearnerStats
from tests.test_learner import PROMISING, Rig, ScriptedGate, run_with_rig, until


def candidate(batch_id: str) -> LearnedCandidate:
    return LearnedCandidate("s", batch_id, "sao", {"adapter": batch_id.encode()}, "r0", {}, 0)


class RecordingLine:
    """The lane's other side (`reef.commit.gate_lane.Line`), keeping what the lane hands it."""

    def __init__(self) -> None:
        self.lineage, self.line_published, self.drop_reason = 0, 0, ""
        self.settled: list[tuple[str, str]] = []  # (batch id, decision)
        self.abandoned: list[tuple[str, str]] = []
        self.left: list[str] = []

    def starved(self) -> bool:
        return False

    def for_gate(self, candidate: LearnedCandidate) -> LearnedCandidate:
        return candidate

    async def settle(self, outcome: Outcome) -> None:
        assert outcome.verdict is not None, outcome.error
        self.settled.append((outcome.candidate.batch_id, outcome.verdict.decision))
        if outcome.verdict.decision == "select":
            self.line_published = outcome.position

    async def left_gate(self, queued: Queued) -> None:
        self.left.append(queued[0].batch_id)

    async def abandon(self, batch_id: str, reason: str, routine: bool = False, metrics: dict | None = None) -> None:
        self.abandoned.append((batch_id, reason.split(":")[0]))

    def failed(self, exc: Exception) -> None:
        raise AssertionError(f"the lane failed: {exc}")


def test_the_gates_lane_alone_judges_the_newest_holds_and_abandons_a_dropped_line() -> None:
    async def main() -> None:
        release = asyncio.Event()
        warmed: list[bool] = []

        async def decide(c: LearnedCandidate) -> Verdict:
            await release.wait()
            return Verdict("select" if c.batch_id == "b3" else "reject", {})

        async def warm(starved: bool) -> int:
            warmed.append(starved)
            return 0

        lane = GateLane("s", decide, lambda batch_id: {}, gate_after=2, warm=warm)
        line = RecordingLine()
        lane.line = line
        await lane.offer((candidate("b1"), 0, 1))
        await lane.go()  # one batch past the release: held, the gate answers ahead instead
        await until(lane.idle, "the gate's turn")
        assert lane.waiting is not None and warmed == [False] and line.settled == []
        await lane.offer((candidate("b2"), 0, 2))  # takes b1's place, and goes
        await lane.go()
        await until(lambda: lane.at_gate is not None, "b2 at the gate")
        await lane.offer((candidate("b3"), 0, 3))  # waits while b2 is judged
        await lane.go()
        line.lineage = 1  # the learner dropped the line: b3 goes to the gate only to be abandoned
        release.set()
        await until(lane.idle, "the gate's turns")
        assert line.abandoned == [("b1", "superseded"), ("b3", "trained on from a candidate that was dropped")]
        assert line.settled == [("b2", "reject")] and line.left == ["b2"]
        await lane.offer((candidate("b4"), 1, 1))  # one batch into the new line: held
        await lane.go()
        await until(lane.idle, "the gate's turn")
        assert lane.waiting is not None and line.settled == [("b2", "reject")]
        await lane.unhold()  # the traffic lags: it goes all the same
        await until(lambda: lane.idle() and lane.waiting is None, "b4 judged")
        assert line.settled == [("b2", "reject"), ("b4", "reject")] and line.left == ["b2", "b4"]

    asyncio.run(main())


class RecordingCanary:
    """The server's side of the canary (`CanaryServing`), keeping its calls."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.calls: list[str] = []

    async def start(self, batch_id: str, files: Mapping[str, bytes]) -> str:
        self.calls.append(f"start {batch_id}")
        return canary_release_id(batch_id)

    async def stop(self) -> None:
        self.calls.append("stop")


def reported(release_id: str, score: float, n: int) -> ReportedRecords:
    release = ReleaseRef(release_id, release_id, "load")
    record = Record(f"{release_id}-{n}", "s", release, {}, RecordStatus.COMPLETE)
    return ReportedRecords(Report(f"rep-{release_id}-{n}", "s", (record.id,), score), (record,))


def test_the_canary_loop_alone_serves_the_live_line_and_withdraws_a_worse_canary() -> None:
    async def main() -> None:
        serving = RecordingCanary(0.5)
        loop = CanaryLoop("s", serving, None, LearnerStats())
        await loop.serve(candidate("b1"), lambda: False)  # a line the head left: never served
        assert serving.calls == [] and not loop.live.running
        first = candidate("b1")
        await loop.serve(first, lambda: True)
        assert serving.calls == ["start b1"] and loop.batch == "b1"
        await loop.left_gate("b0", line_dropped=False)  # another candidate's verdict: it keeps serving
        assert loop.live.running
        for n in range(WITHDRAW_BY):
            await loop.watch([reported("r0", 1.0, n), reported(canary_release_id("b1"), 0.0, n)], "r0")
            if not loop.live.running:
                break
        assert serving.calls == ["start b1", "stop"] and loop.live.withdrawn == 1
        # its commit-log line (a verdict or an abandon, written from its metrics) says so: it outlives the process
        assert first.metrics["canary"]["withdrawn"] is True and first.metrics["canary"]["scores"] >= 1
        second = candidate("b2")
        await loop.serve(second, lambda: True)
        await loop.left_gate("b2", line_dropped=False)  # judged: it stops
        assert serving.calls[-2:] == ["start b2", "stop"] and loop.batch is None
        assert "canary" not in second.metrics

    asyncio.run(main())


def test_the_training_loop_alone_fills_the_lanes_queue_while_the_gate_holds(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    async def body(rig: Rig) -> None:
        gate = ScriptedGate(("reject", PROMISING), ("reject", PROMISING))
        learner = rig.learner(gate, gate_after=10)  # no candidate is far enough along to be judged
        for _ in range(3):
            await rig.feed(4)
            assert await learner.step()
        queued: Any = learner.lane.waiting
        assert queued is not None and queued[2] == 3 and gate.judged == []  # the third, three batches into its line
        assert learner.stats.abandoned == 2 and learner.working is not None  # two superseded, trained on all along
        learner.lane.cancel()

    run_with_rig(tmp_path, tiny_model_dir, body)
