"""The canary: the weights candidate under test serves a fraction of an opted-in scenario's
requests. Routing and unloading on the real embedded runtime (tiny model) and a real state
directory; the learner's side (started with each candidate the gate judges, stopped with the
verdict, withdrawn at once when live scores are worse, its records trained on as the freshest
samples, a rollback mid-canary) with the real training process and scripted verdicts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Awaitable, Callable, Mapping

from reef.commit.state import ReefState
from reef.config import RecipeConfig, ServeConfig
from reef.core.chat import ChatRequest, ChatResult, Message
from reef.grow.canary import MIN_SCORES, WITHDRAW_BY, LiveScores, canary_release_id, live_worse
from reef.runtimes.embedded import EmbeddedRuntime
from reef.serve.scenarios import ScenarioDirectory
from tests.helpers.lora import lora_files
from tests.test_learner import PROMISING, Rig, ScriptedGate, run_with_rig, until


def with_directory(
    model_dir: Path, tmp_path: Path, body: Callable[[ReefState, EmbeddedRuntime, ScenarioDirectory], Awaitable[None]]
) -> None:
    """Run `body` with the embedded tiny model started and a scenario directory on a real state."""

    async def main() -> None:
        runtime = EmbeddedRuntime(model_dir, threads=1, default_max_tokens=4)
        await runtime.start()
        try:
            with ReefState.open(tmp_path / "state") as state:
                await body(state, runtime, ScenarioDirectory(state, runtime, RecipeConfig()))
        finally:
            await runtime.close()

    asyncio.run(main())


def test_live_scores_withdraw_only_on_evidence_that_the_canary_is_worse() -> None:
    assert not live_worse([0.0] * (MIN_SCORES - 1), [1.0] * 64)  # too few canary scores yet
    assert live_worse([0.0] * MIN_SCORES, [1.0, 0.0] * 32)
    assert not live_worse([1.0, 0.0] * 8, [1.0, 0.0] * 32)  # the same: no reason to withdraw
    assert not live_worse([1.0] * 16, [0.0] * 16)  # better is not worse
    # eight 0s from a canary as good as a release that scores 0.2 one time in four (one run in ten
    # looks like this): not enough to withdraw it (the canary's own variance, 0, would have)
    assert not live_worse([0.0] * MIN_SCORES, [0.0, 0.0, 0.0, 0.2] * 16)
    assert live_worse([0.0] * 4 * MIN_SCORES, [0.0, 0.0, 0.0, 0.2] * 16)  # thirty-two 0s are
    live = LiveScores()
    live.add([], "head")
    assert not live.worse()  # no canary running
    live.start("canary-b1")
    live.canary.extend([1.0, 0.0] * 8)
    live.start("canary-b2")  # a newer candidate serves the canary; then b1 is published
    live.published("r2", "canary-b1")  # b1 serves everyone now: its live scores are the yardstick
    assert live.serving_id == "r2" and list(live.serving) == [1.0, 0.0] * 8 and live.canary == []
    live.add([], "r2")
    assert len(live.serving) == 16


def test_a_canary_serves_its_fraction_of_an_opted_in_scenario_and_unloads_when_free(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    async def body(state: ReefState, runtime: EmbeddedRuntime, directory: ScenarioDirectory) -> None:
        await directory.create("s")
        await directory.create("t")
        files = lora_files(tiny_model_dir, tmp_path / "adapter")
        ref = await directory.start_canary("s", canary_release_id("b1"), files, 0.5)
        assert ref.content_id.startswith("sha256:")  # a content id like any release's, of what it serves
        served = []
        for _ in range(200):
            async with directory.admit("s") as admitted:
                served.append(admitted.release_id)
            async with directory.admit("t") as other:
                assert other.release_id == state.chain("t").head().release_id  # not opted in
        assert 60 < served.count(ref.release_id) < 140 and set(served) == {
            ref.release_id,
            state.chain("s").head().release_id,
        }
        result = ChatResult()
        request = ChatRequest(model="m", messages=(Message("user", "hi"),), dialect="openai", max_tokens=4)
        async for delta in runtime.generate(request, ref):
            result.add(delta)
        assert result.token_ids  # the canary's load serves, stamped with its own load id

        pinned = directory.admit("s")
        while (await pinned.__aenter__()).release_id != ref.release_id:  # hold a request on the canary
            await pinned.__aexit__(None, None, None)
            pinned = directory.admit("s")
        await directory.stop_canary("s")
        async with directory.admit("s") as after:
            assert after.release_id != ref.release_id  # no new request goes to it
        await asyncio.sleep(0.2)
        assert ref.runtime_load_id in runtime._loads  # the request in flight keeps it loaded
        await pinned.__aexit__(None, None, None)
        await until(lambda: ref.runtime_load_id not in runtime._loads, "the canary unloaded", 10)

    with_directory(tiny_model_dir, tmp_path, body)


def test_a_worse_canary_is_withdrawn_by_its_bound_of_reports_even_when_no_test_is_sure() -> None:
    serving = [1.0, 0.0] * 32  # mean 0.5
    slightly_worse = [1.0, 0.0] * 15 + [0.0]  # mean 0.48: far from significant
    assert not live_worse(slightly_worse, serving)  # 31 scores: the z-test alone decides, and is not sure
    assert live_worse(slightly_worse + [0.0], serving)  # the 32nd: its mean is below, withdrawn
    assert len(slightly_worse) + 1 == WITHDRAW_BY
    assert not live_worse([1.0, 0.0] * 40, serving)  # as good, however many scores: never withdrawn
    assert not live_worse([1.0] * 40, [0.0] * (MIN_SCORES - 1))  # no yardstick yet: nothing to compare


def test_learner_canary_settings_are_checked() -> None:
    import pytest

    assert ServeConfig.model_validate({"learner": {"canary": {"s": 0.05}}}).learner.canary == {"s": 0.05}
    with pytest.raises(ValueError, match=r"learner.canary.s must be a fraction in \(0, 1\]"):
        ServeConfig.model_validate({"learner": {"canary": {"s": 1.5}, "canary_max_fraction": 1.0}})
    # the canary serves a candidate the gate has not selected: a small share unless raised knowingly
    assert ServeConfig().learner.canary_max_fraction == 0.1
    with pytest.raises(ValueError, match=r"learner.canary.s is 0.25, above learner.canary_max_fraction \(0.1\)"):
        ServeConfig.model_validate({"learner": {"canary": {"s": 0.25}}})
    with pytest.raises(ValueError, match=r"learner.gate.live_split is 0.5, above learner.canary_max_fraction"):
        ServeConfig.model_validate({"learner": {"canary": {"s": 0.1}, "gate": {"live_split": 0.5}}})
    raised = ServeConfig.model_validate({"learner": {"canary": {"s": 0.5}, "canary_max_fraction": 0.5}})
    assert raised.learner.canary == {"s": 0.5}


class RecordingCanary:
    fraction = 0.5

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start(self, batch_id: str, files: Mapping[str, bytes]) -> str:
        assert files
        self.calls.append(f"start {batch_id}")
        return canary_release_id(batch_id)

    async def stop(self) -> None:
        self.calls.append("stop")


def test_the_newest_candidate_serves_the_canary_its_records_train_and_a_worse_one_is_withdrawn(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    async def body(rig: Rig) -> None:
        canary, gate = RecordingCanary(), ScriptedGate(("reject", PROMISING), ("reject", PROMISING))
        learner = rig.learner(gate, canary)
        gate.hold.clear()
        await rig.feed(4)
        await learner.step()
        b1 = rig.batches()[0]["batch_id"]
        await until(lambda: canary.calls == [f"start {b1}"], "the canary of candidate 1")
        await rig.feed(MIN_SCORES, score=lambda i: 1.0)  # the serving release does well
        await rig.feed(MIN_SCORES, score=lambda i: 0.0, release_id=canary_release_id(b1))  # its canary does not
        await learner.step()  # reads the reports: withdrawn at once, while the gate still judges
        batch = rig.batches()[1]  # then candidate 2 trained on the newest samples, the canary's
        assert canary.calls == [f"start {b1}", "stop", f"start {batch['batch_id']}"] and learner.live.withdrawn == 1
        assert learner.status()["canary"]["running"] is True  # the newest candidate serves the canary now
        assert all(rid in batch["record_ids"] for rid in [f"rec{i}" for i in range(4 + 2 * MIN_SCORES - 4, 20)])
        assert "unknown_release" not in learner.stats.dropped
        gate.hold.set()
        await until(lambda: len(gate.judged) == 2 and learner._gate_idle(), "both verdicts")
        b2 = batch["batch_id"]
        assert canary.calls == [f"start {b1}", "stop", f"start {b2}", "stop"]  # stopped once each

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_a_canary_a_little_worse_is_withdrawn_once_it_has_its_bound_of_reports(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Live scores a little worse than the serving release's, never significantly: withdrawn by
    the learner at the step that reads the canary's WITHDRAW_BY-th score, not left serving until
    its verdict."""

    async def body(rig: Rig) -> None:
        canary, gate = RecordingCanary(), ScriptedGate(("reject", PROMISING), ("reject", PROMISING))
        learner = rig.learner(gate, canary)
        gate.hold.clear()  # candidate 1 stays at the gate: its canary serves
        await rig.feed(4)
        await learner.step()
        b1 = rig.batches()[0]["batch_id"]
        serving = [1.0, 0.0] * 16  # mean 0.5
        worse = [1.0, 0.0] * 15 + [0.0, 0.0]  # mean 0.47: a z of 0.25, nowhere near sure
        assert len(worse) == WITHDRAW_BY
        await rig.feed(len(serving), score=lambda i: serving[i - 4])
        await rig.feed(len(worse), score=lambda i: worse[i - 4 - len(serving)], release_id=canary_release_id(b1))
        await learner.step()
        assert canary.calls[:2] == [f"start {b1}", "stop"] and learner.live.withdrawn == 1, canary.calls
        gate.hold.set()
        await until(lambda: learner._gate_idle(), "the verdicts")

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_a_rollback_mid_canary_stops_it_and_voids_the_candidate(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        canary, gate = RecordingCanary(), ScriptedGate(("select", PROMISING), ("select", PROMISING))
        learner = rig.learner(gate, canary)
        start = rig.chain.head().release_id
        await rig.feed(4)
        await learner.step()
        await until(lambda: learner._gate_idle() and rig.chain.head().release_id != start, "candidate 1 published")
        gate.hold.clear()
        await rig.feed(4)
        await learner.step()
        await until(lambda: len(canary.calls) == 3 and learner.waiting is None, "candidate 2 a canary, at the gate")
        rolled = rig.chain.rollback(start, None)  # an operator rolls back while candidate 2 is a canary
        gate.hold.set()
        await until(lambda: learner._gate_idle(), "the gate's turn")
        assert canary.calls[-1] == "stop" and rig.chain.head().release_id == rolled.release_id
        reason = rig.chain.history()[-1].metrics["reason"]
        assert reason.startswith("head_moved") and learner.working is None

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_a_canary_keeps_the_serving_releases_harness_in_front_of_its_requests(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The canary serves the candidate's weights over the serving release's files: a learned
    system prompt (inject mode, the default) still goes in front of the requests it serves."""
    from reef.commit.release_chain import Candidate
    from reef.core.types import ArtifactKind, Verdict

    async def body(state: ReefState, runtime: EmbeddedRuntime, directory: ScenarioDirectory) -> None:
        chain = await directory.create("s")
        rule = b"Answer in one word."
        learned = chain.publish(
            Candidate({"harness/system.md": rule}, ArtifactKind.HARNESS),
            chain.head().release_id,
            verdict=Verdict("select", {}),
        )
        await directory.serve_release(chain, learned)
        ref = await directory.start_canary(
            "s", canary_release_id("b1"), lora_files(tiny_model_dir, tmp_path / "a"), 1.0
        )
        async with directory.admit("s") as admitted:
            assert admitted == ref
        request = ChatRequest(model="m", messages=(Message("user", "hi"),), dialect="openai", max_tokens=4)
        sent, added = await directory.harness.inject("s", request, admitted)
        assert added is not None and sent.messages[0].role == "system"
        assert sent.messages[0].content.startswith(rule.decode())

    with_directory(tiny_model_dir, tmp_path, body)
