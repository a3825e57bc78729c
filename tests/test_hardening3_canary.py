"""Hardening 3: a rollback against a running canary, and the gate's load under a rollback.

- A rollback answered by `reef serve` stops the scenario's canary before its answer: no request
  after it is served by the canary, and no candidate of the rolled-back line is canaried or
  published after it (a real server, the tiny model, a canary on every request).
- A rollback made elsewhere (another front end: no call reaches this learner) while a candidate
  trains: the learner sees the head moved when the candidate is made and neither canaries nor
  judges it (the real training process, canary and embedded runtime; the gate scripted).
- A rollback while the gate judges: the gate keeps the serving release's load pinned until its
  verdict is in, so it never answers on an unloaded release; the moved head makes the verdict
  stale, and the candidate is abandoned cleanly (`StaleHead`, logged by the learner as
  `head_moved`, no traceback); the old load goes once the gate lets it go.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import openai
import pytest

from reef.client import ReefClient
from reef.commit.gate import WeightsGate
from reef.commit.publisher import CandidatePublisher
from reef.commit.state import ReefState
from reef.config import GateConfig, RecipeConfig
from reef.core.errors import StaleHead
from reef.core.learned import LearnedCandidate
from reef.core.types import Operation
from reef.grow.canary import CANARY_PREFIX, canary_release_id
from reef.runtimes.embedded import EmbeddedRuntime
from reef.serve.canary import ScenarioCanary
from reef.serve.scenarios import ScenarioDirectory
from tests.helpers.lora import lora_files
from tests.helpers.reef_server import ReefServer
from tests.test_learner import PROMISING, Rig, ScriptedGate, run_with_rig, until

SCORED: list[float] = []  # every answer the gate scored in this process (`counting_score`)


def counting_score(task: dict, text: str) -> float:
    """The gate's scorer here: every answer alike (every task ties, so no look decides early),
    each call counted, so a test knows the gate is mid-verdict."""
    SCORED.append(0.5)
    return 0.5


# -- through the route ----------------------------------------------------------------------------


def test_a_rollback_stops_the_canary_before_its_answer(tiny_model_dir: Path, tmp_path: Path) -> None:
    settings = {
        "embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": 4, "threads": 1},
        "learner": {
            "poll_interval": 0.1,
            "train_threads": 1,
            "sao": {"batch_size": 4, "steps_per_candidate": 1, "lr": 0.01},
            # candidates wait for the gate while the traffic flows, each serving the
            # canary in turn; a verdict would reject (no held-out records)
            "gate": {"after_batches": 50, "holdout_fraction": 0.0},
            "canary_max_fraction": 1.0,
            "canary": {"s": 1.0},
        },
    }
    with ReefServer(tmp_path, settings) as reef, ReefClient(reef.url, timeout=60) as client:
        oai = openai.OpenAI(base_url=reef.base_url, api_key="x", max_retries=0, timeout=60)

        def ask(report: bool) -> str:
            raw = oai.chat.completions.with_raw_response.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                extra_headers={"x-reef-scenario": "s"},
            )
            if report:
                client.report(raw.headers["x-reef-agent-record-id"], score=0.5)
            return raw.headers["x-reef-release-id"]

        start = client.create_scenario("s")["head"]["release_id"]
        deadline = time.monotonic() + 120
        while not ask(report=True).startswith(CANARY_PREFIX):  # until a candidate serves the canary
            assert time.monotonic() < deadline, client.status()["learning"]
        for _ in range(8):  # more batches in training as the rollback comes
            ask(report=True)
        rolled = client.rollback("s", start)["release"]["release_id"]
        served_after = [ask(report=False) for _ in range(40)]
        deadline = time.monotonic() + 60
        while _learner(client)["state"] not in ("collecting", "evaluating"):  # a batch training at the rollback is made
            assert time.monotonic() < deadline, _learner(client)
            served_after.append(ask(report=False))
        served_after += [ask(report=False) for _ in range(10)]
        head = client.scenario("s")["head"]["release_id"]
    with ReefState.open(reef.state_dir) as state:
        history = state.chain("s").history()
    rollback_step = next(e.step for e in history if e.operation is Operation.ROLLBACK)
    old_line = {
        canary_release_id(e.batch["batch_id"])
        for e in history
        if e.operation is Operation.BATCH and e.batch and e.step < rollback_step
    }
    by_old_line = [release for release in served_after if release in old_line]
    # its canary stopped before the answer, and none of its candidates was canaried after it
    assert not by_old_line, f"{len(by_old_line)} of {len(served_after)} requests after the rollback: {set(by_old_line)}"
    # the rest is the rolled-back release, or a canary of a batch begun after it (trained from the new head)
    assert {r for r in served_after if not r.startswith(CANARY_PREFIX)} == {rolled}
    assert head == rolled  # and nothing of the old line published on top of it


def _learner(client: ReefClient) -> dict:
    return next(s for s in client.status()["learning"]["learners"] if s["scenario"] == "s")


# -- a rollback on another front end, while a candidate trains --------------------------------------


def test_a_candidate_that_trained_as_the_head_moved_is_never_canaried(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        runtime = EmbeddedRuntime(tiny_model_dir, threads=1, default_max_tokens=4)
        await runtime.start()
        try:
            directory = ScenarioDirectory(rig.state, runtime, RecipeConfig())
            await directory.start()
            gate = ScriptedGate(("reject", PROMISING), ("reject", PROMISING))
            learner = rig.learner(gate, ScenarioCanary(directory, "s", 1.0))
            start = rig.chain.head().release_id
            gate.hold.clear()  # candidate 1 stays at the gate
            await rig.feed(4)
            await learner.step()
            b1 = rig.batches()[0]["batch_id"]
            assert directory.canaries["s"][0].release_id == canary_release_id(b1)
            await rig.feed(4)
            # the training process's queue for "s" is first-come: a long job ahead of candidate 2
            # keeps it training until the rollback below is in the log
            blocker = asyncio.create_task(
                rig.worker.logprobs(None, [([1, 4093, 198], [300 + i % 50] * 64) for i in range(80)], key="s")
            )
            await until(lambda: rig.worker.pending().get("s") == 1, "the long job in the training process")
            making = asyncio.create_task(learner.step())
            await until(lambda: len(rig.batches()) == 2 and rig.worker.pending().get("s") == 2, "candidate 2 queued")
            rolled = await asyncio.to_thread(rig.chain.rollback, start, None)  # another front end's rollback
            assert not blocker.done(), "the rollback came after candidate 2 trained: lengthen the long job"
            await making
            await blocker
            b2 = rig.batches()[1]["batch_id"]
            assert rig.chain.head().release_id == rolled.release_id
            canary = directory.canaries.get("s")
            assert canary is None, f"{canary[0].release_id} serves after the rollback (candidate 2 is {b2})"
            closed = {
                e.metrics["batch_id"]: e.metrics.get("reason", "")
                for e in rig.chain.history()
                if e.metrics.get("batch_id") == b2 and e.operation.value == "abandon"
            }
            assert "the head moved" in closed.get(b2, ""), rig.chain.history()[-1]
            gate.hold.set()
            await until(lambda: learner._gate_idle(), "candidate 1's verdict")
            assert len(gate.judged) == 1  # candidate 1 only; candidate 2 never went to the gate
            assert "s" not in directory.canaries and rig.chain.head().release_id == rolled.release_id
        finally:
            await runtime.close()

    run_with_rig(tmp_path, tiny_model_dir, body)


# -- a rollback while the gate judges ---------------------------------------------------------------


def test_a_rollback_while_the_gate_judges_leaves_its_load_until_the_verdict(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(120)))
    config = GateConfig(
        tasks=str(tasks),
        scorer=f"{__name__}:counting_score",
        looks=4,
        max_tokens=8,
        concurrency=1,
        concurrency_when="always",
    )
    files = lora_files(tiny_model_dir, tmp_path / "adapter")

    async def main() -> None:
        runtime = EmbeddedRuntime(tiny_model_dir, threads=1, default_max_tokens=8)
        await runtime.start()
        try:
            with ReefState.open(tmp_path / "state") as state:
                directory = ScenarioDirectory(state, runtime, RecipeConfig())
                chain = await directory.create("s")
                start = chain.head()
                publisher = CandidatePublisher(
                    chain,
                    WeightsGate(config, runtime, worker=None),  # type: ignore[arg-type]
                    pin=directory.pin,
                )
                judged_on = chain.serving().runtime_load_id
                candidate = LearnedCandidate("s", "b1", "sao", files, start.release_id, {}, 0)
                SCORED.clear()
                verdict = asyncio.create_task(publisher.decide(candidate))
                await until(lambda: SCORED, "the gate's first answers")
                rolled = await asyncio.to_thread(chain.rollback, start.release_id, None)
                await directory.serve_release(chain, rolled)  # what the route does: serve it, retire the old load
                assert len(SCORED) < 2 * 120, "the gate had finished before the rollback: give it more tasks"
                assert judged_on in runtime._loads  # pinned by the gate, not unloaded under it
                with pytest.raises(StaleHead):  # the verdict is in, on the load it began on; the head moved
                    await verdict
                assert len(SCORED) == 2 * 120
                await until(lambda: judged_on not in runtime._loads, "the old load unloaded once the gate let go", 10)
                assert chain.head().release_id == rolled.release_id
        finally:
            await runtime.close()

    asyncio.run(main())
