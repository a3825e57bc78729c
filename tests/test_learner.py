"""The weights learner's own rules, on a real state directory and the real training process
(tiny model), with the gate's verdicts scripted: training goes on while the gate judges, and
the gate takes the newest candidate (one it skips is logged as superseded); one trained from a candidate the gate then found surely worse is abandoned
unjudged; a rejected candidate not surely worse is trained on; a batch is the newest samples; two batches open at a crash are both
resumed, in order."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from reef.commit.gate import sign_test_p
from reef.commit.publisher import CandidatePublisher
from reef.commit.state import ReefState
from reef.core.learned import LearnedCandidate
from reef.core.live_evidence import LiveEvidence
from reef.core.types import Operation, Record, RecordStatus, ReleaseRef, Report, TokenSpan, Verdict
from reef.grow.learner import Learner
from reef.grow.training_client import TrainingClient
from reef.grow.worker import TrainingWorker
from reef.recipes.sao import SAOConfig, SAORecipe
from reef.serve.learning import wire_learner

PROMPT = [1, 4093, 198, 19556, 314, 216, 33, 30, 2, 198, 1, 520, 9531, 198]  # any ids the tiny model knows
LOSING = {"wins": 0, "losses": 6, "p_worse": sign_test_p(6, 0)}  # surely worse: dropped
PROMISING = {"wins": 3, "losses": 5, "p_worse": sign_test_p(5, 3)}  # lost, but not surely worse: trained on


class ScriptedGate:
    """Gives the verdicts it is told, in order; `hold` keeps the next judgment waiting."""

    def __init__(self, *verdicts: tuple[str, dict[str, Any]]) -> None:
        self.verdicts = list(verdicts)
        self.judged: list[str] = []  # candidate content ids, in the order judged
        self.starved: list[bool] = []  # whether the learner was waiting for samples, for each
        self.live: list[LiveEvidence | None] = []  # the split's live scores handed over with each
        self.hold = asyncio.Event()
        self.hold.set()
        self.warmed: list[str] = []  # the serving release's content id, each time it was asked to warm

    def remember(self, releases: Any) -> None:  # the chain's verdicts, for `gate.halves`: nothing to keep here
        return None

    async def warm(self, current: ReleaseRef, starved: bool = False, files: Any = None) -> int:
        self.warmed.append(current.content_id)
        return 0

    async def judge(
        self,
        current: ReleaseRef,
        current_files: Any,
        candidate_id: str,
        candidate_files: Any,
        holdout: Any,
        starved: bool = False,
        live: LiveEvidence | None = None,
        thresholds: Any = None,
    ) -> Verdict:
        await self.hold.wait()
        self.judged.append(candidate_id)
        self.starved.append(starved)
        self.live.append(live)
        decision, metrics = self.verdicts.pop(0)
        return Verdict(decision, dict(metrics))


class ChunkedWarmGate(ScriptedGate):
    """Has `chunks` chunks of tasks to answer ahead for the serving release, one a call of warm."""

    def __init__(self, chunks: int, *verdicts: tuple[str, dict[str, Any]]) -> None:
        super().__init__(*verdicts)
        self.chunks_left = chunks

    async def warm(self, current: ReleaseRef, starved: bool = False, files: Any = None) -> int:
        self.warmed.append(current.content_id)
        if not self.chunks_left:
            return 0
        await asyncio.sleep(0.05)
        if self.chunks_left <= 0:  # emptied by the test while this chunk was being answered
            return 0
        self.chunks_left -= 1
        return 8


class Rig:
    """A state directory, the training process, and records fed in with on-policy log-probs."""

    def __init__(self, state: ReefState, worker: TrainingWorker) -> None:
        self.state, self.worker = state, worker
        self.chain = state.chain("s") if "s" in state.scenarios() else state.create("s", "sao")
        self.fed = 0

    async def feed(
        self, n: int, score: Callable[[int], float] = lambda i: float(i % 2), release_id: str | None = None
    ) -> list[str]:
        """`n` reported records served by the head (or by `release_id`, a canary)."""
        head = self.chain.head().ref
        release = ReleaseRef(release_id or head.release_id, release_id or head.content_id, "load-test")
        completions = [[300 + self.fed + i, 301, 2] for i in range(n)]
        logprobs = await self.worker.logprobs(None, [(PROMPT, c) for c in completions])
        ids = []
        for completion, lps in zip(completions, logprobs):
            rid = f"rec{self.fed}"
            self.state.store.put_record(Record(rid, "s", release, {"temperature": 1.0, "messages": []}))
            self.state.store.finish_record(
                rid,
                RecordStatus.COMPLETE,
                response={"prompt_token_ids": PROMPT},
                token_ids=completion,
                logprobs=list(lps),
                spans=[TokenSpan(0, len(completion), "load-test")],
            )
            self.state.store.put_report(Report(f"rep{self.fed}", "s", (rid,), score(self.fed)))
            ids.append(rid)
            self.fed += 1
        return ids

    def learner(
        self,
        gate: ScriptedGate,
        canary: Any = None,
        gate_after: int = 1,
        live_split: float | None = None,
        answer_ahead_after: float = 60.0,
    ) -> Learner:
        publisher = CandidatePublisher(self.chain, gate)  # type: ignore[arg-type]

        async def decide_and_serve(candidate: LearnedCandidate) -> Verdict:
            verdict = await publisher.decide(candidate)
            if verdict.decision == "select":  # served as the server follows the head (no runtime here)
                self.chain.advance(self.chain.serving().release_id, self.chain.head().ref)
            return verdict

        recipe = SAORecipe(SAOConfig(batch_size=4, steps_per_candidate=1, lr=0.01, max_staleness=5))
        return wire_learner(
            self.chain,
            self.state.store,
            recipe,
            decide_and_serve,
            publisher.head_files,
            TrainingClient(self.worker, "s"),
            poll_interval=0.05,
            canary=canary,
            gate_after=gate_after,
            warm=publisher.warm,
            live_split=live_split,
            answer_ahead_after=answer_ahead_after,
        )

    def closers(self) -> list[tuple[str, str]]:
        """(operation, batch id) of every step that closed a batch, in order."""
        return [
            (e.operation.value, e.metrics["batch_id"])
            for e in self.chain.history()
            if e.operation is not Operation.BATCH and "batch_id" in e.metrics
        ]

    def batches(self) -> list[dict[str, Any]]:
        return [e.batch for e in self.chain.history() if e.operation is Operation.BATCH]


def run_with_rig(tmp_path: Path, model_dir: Path, body: Callable[[Rig], Awaitable[None]]) -> None:
    async def main() -> None:
        worker = TrainingWorker(model_dir, threads=1)
        await worker.start()
        try:
            with ReefState.open(tmp_path / "state") as state:
                await body(Rig(state, worker))
        finally:
            await worker.close()

    asyncio.run(main())


async def until(condition: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_the_next_candidate_trains_while_the_gate_judges(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        gate = ScriptedGate(("reject", LOSING), ("reject", PROMISING), ("select", PROMISING))
        learner = rig.learner(gate)
        gate.hold.clear()
        await rig.feed(4)
        assert await learner.step() is True  # candidate 1 trained, now at the gate (held)
        await rig.feed(4)
        # candidate 2 trains from candidate 1 while the gate still holds candidate 1, then waits for it
        assert await learner.step() is True
        assert len(rig.chain.open_batches()) == 2 and learner.waiting is not None and gate.judged == []
        gate.hold.set()  # candidate 1 is surely worse: candidate 2 continued from it, so it is void
        await until(lambda: learner._gate_idle(), "the gate's turn")
        b1, b2 = (b["batch_id"] for b in rig.batches())
        assert rig.closers() == [("rejection", b1), ("abandon", b2)] and len(gate.judged) == 1
        abandon = rig.chain.history()[-1]
        assert abandon.metrics["reason"] == (
            "trained on from a candidate that was dropped: the gate found it worse than the serving release"
        )
        assert learner.working is None and learner.stats.abandoned == 1

        await rig.feed(4)
        await learner.step()  # candidate 3, from the head; it loses, but not surely: trained on
        await rig.feed(4)
        await learner.step()  # candidate 4, from candidate 3
        await until(lambda: len(gate.judged) == 3, "candidate 4 judged")
        await until(lambda: learner._gate_idle(), "the publication")
        await learner.step()
        b3, b4 = (b["batch_id"] for b in rig.batches()[2:])
        assert rig.closers()[2:] == [("rejection", b3), ("training", b4)]
        assert len(set(gate.judged)) == 3  # three different adapters
        assert rig.chain.head().release_id != rig.chain.releases()[-1].release_id  # published
        assert rig.chain.high_water() == learner.cursor  # the cursor in the log never goes back
        assert rig.chain.open_batches() == []

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_the_gate_judges_the_newest_candidate_and_logs_the_one_it_replaced(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(rig: Rig) -> None:
        gate = ScriptedGate(("reject", PROMISING), ("select", PROMISING))
        learner = rig.learner(gate)
        gate.hold.clear()
        for _ in range(3):  # 1 goes to the gate (held); 2 waits; 3, trained on from 2, takes its place
            await rig.feed(4)
            await learner.step()
        assert len(rig.chain.open_batches()) == 2  # 1 at the gate, 3 waiting; 2 closed as superseded
        gate.hold.set()
        await until(lambda: len(gate.judged) == 2 and learner._gate_idle(), "both judgments")
        b1, b2, b3 = (b["batch_id"] for b in rig.batches())
        assert rig.closers() == [("abandon", b2), ("rejection", b1), ("training", b3)]
        reason = next(e.metrics["reason"] for e in rig.chain.history() if e.metrics.get("batch_id") == b2)
        assert reason.startswith(f"superseded: batch {b3}, trained on from it")
        assert rig.chain.open_batches() == [] and learner.stats.candidates == 3

    caplog.set_level(logging.INFO, logger="reef.learner")
    run_with_rig(tmp_path, tiny_model_dir, body)
    superseded = [r for r in caplog.records if "superseded" in r.getMessage()]
    assert [r.levelno for r in superseded] == [logging.INFO]  # routine work, not a warning on the operator's terminal


def test_a_candidate_made_while_the_gate_answers_ahead_waits_for_one_chunk_not_every_task(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    async def body(rig: Rig) -> None:
        gate = ChunkedWarmGate(10_000, ("select", PROMISING))  # over eight minutes of answers ahead
        learner = rig.learner(gate, gate_after=2)
        await rig.feed(4)
        await learner.step()  # one batch past the base: held, so the gate answers its tasks ahead
        await until(lambda: gate.chunks_left < 10_000 - 5, "the gate answering ahead, chunk after chunk")
        await rig.feed(4)
        await learner.step()  # two past: ready
        await until(lambda: gate.judged, "the verdict", timeout=30)
        assert gate.chunks_left > 9_000  # judged between two chunks, not after them all
        gate.chunks_left = 0
        await until(lambda: learner._gate_idle(), "the gate's turns to end")

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_the_gate_answers_ahead_before_the_first_candidate_once_the_traffic_shows_thin(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Thin traffic (no first batch after `answer_ahead_after` seconds) leaves the gate's side idle:
    it answers its tasks for the serving release then, so the first verdict asks only its
    candidate. Before that it waits, so as not to slow the first batches of busy traffic."""

    async def body(rig: Rig) -> None:
        gate = ChunkedWarmGate(30, ("select", PROMISING))  # 1.5 s of answers
        learner = rig.learner(gate, answer_ahead_after=1.0)
        run = asyncio.get_running_loop().create_task(learner.run())
        try:
            await asyncio.sleep(0.5)  # ten polls, under the threshold
            assert gate.warmed == []
            await until(lambda: gate.chunks_left < 30, "the gate answering ahead")
            await asyncio.sleep(0.3)  # a few polls while it answers
            assert not learner._gate_idle() and learner.status()["state"] == "collecting"  # no candidate judged
            await until(lambda: gate.chunks_left == 0 and learner._gate_idle(), "the tasks answered ahead")
            assert gate.warmed[0] == rig.chain.serving().content_id and gate.judged == [] and rig.batches() == []
            await rig.feed(4)
            await until(lambda: gate.judged, "the first candidate judged")
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_a_line_goes_to_the_gate_once_it_is_enough_batches_past_the_release(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """With `gate.after_batches: 3` a candidate one or two batches past the release its line would
    replace waits, and the next takes its place (logged as superseded); the third goes. The count
    starts again at a publication (from the release published) and when the line is dropped. A
    held candidate goes once the learner has waited for samples longer than making one takes."""

    async def body(rig: Rig) -> None:
        gate = ScriptedGate(("select", PROMISING), ("reject", LOSING), ("reject", PROMISING))
        learner = rig.learner(gate, gate_after=3)

        async def candidate() -> None:
            await rig.feed(4)
            await learner.step()
            await until(lambda: learner._gate_idle(), "the gate's turn, if it had one")

        base = rig.chain.serving().content_id
        for made in (1, 2):
            await candidate()
            assert gate.judged == [] and learner.status()["batches_past_release"] == made
            assert gate.warmed[-1] == base  # meanwhile the gate answers its tasks for the serving release
        await candidate()  # the third: published
        b1, b2, b3 = (b["batch_id"] for b in rig.batches())
        assert rig.closers() == [("abandon", b1), ("abandon", b2), ("training", b3)]
        assert learner.status()["batches_past_release"] == 0
        assert gate.warmed[-1] == rig.chain.serving().content_id != base  # and then for the new one
        for made in (1, 2):  # counted from the release published
            await candidate()
            assert len(gate.judged) == 1 and learner.status()["batches_past_release"] == made
        await candidate()  # three past it: judged, surely worse, so the line is dropped
        b4, b5, b6 = (b["batch_id"] for b in rig.batches()[3:])
        assert rig.closers()[3:] == [("abandon", b4), ("abandon", b5), ("rejection", b6)]
        await candidate()  # from the head again: one batch past it, so it waits
        assert len(gate.judged) == 2 and learner.status()["batches_past_release"] == 1
        assert len(rig.chain.open_batches()) == 1 and learner.waiting is not None
        assert await learner.step() is False and len(gate.judged) == 2  # no samples yet: still held
        assert learner.wait.making is not None
        await asyncio.sleep(learner.wait.making + 0.1)  # the traffic lags: waited longer than making one
        await learner.step()
        await until(lambda: len(gate.judged) == 3 and learner._gate_idle(), "the held candidate judged")
        assert rig.chain.open_batches() == [] and learner.waiting is None

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_a_candidate_made_after_waiting_for_samples_goes_to_the_gate_marked_starved(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The learner tells the gate when traffic is what it lacks (`gate.concurrency_when: starved`
    then leaves the serving runtime to the traffic): a batch it waited for, long against the
    time it took to make its candidate, marks that candidate."""

    async def body(rig: Rig) -> None:
        gate = ScriptedGate(("reject", PROMISING), ("reject", PROMISING))
        learner = rig.learner(gate)
        await rig.feed(4)
        started = time.monotonic()
        await learner.step()  # the first candidate: its samples were there as the learner began
        making = time.monotonic() - started
        await until(lambda: len(gate.judged) == 1 and learner._gate_idle(), "the first judgment")
        assert learner.status()["waiting_for_samples"] < 0.2
        assert await learner.step() is False  # no samples: the learner waits
        await asyncio.sleep(making)  # waiting as long as making one: half its time
        await rig.feed(4)
        await learner.step()
        await until(lambda: len(gate.judged) == 2, "the second judgment")
        assert gate.starved == [False, True] and learner.status()["waiting_for_samples"] > 0.25

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_the_wait_for_the_first_batch_counts(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A learner begins waiting for samples when it starts: a first candidate whose batch was
    long in coming is judged as made by a starved learner (the gate leaves the runtime to the
    traffic that the learner is waiting for)."""

    async def body(rig: Rig) -> None:
        gate = ScriptedGate(("reject", PROMISING))
        learner = rig.learner(gate)
        assert await learner.step() is False
        await asyncio.sleep(3.0)  # longer than making a candidate of 4 samples on the tiny model
        await rig.feed(4)
        await learner.step()
        await until(lambda: len(gate.judged) == 1, "the first judgment")
        assert gate.starved == [True] and learner.status()["waiting_for_samples"] > 0.5

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_a_batch_is_the_newest_samples(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body(rig: Rig) -> None:
        learner = rig.learner(ScriptedGate(("reject", LOSING)))
        ids = await rig.feed(10)
        await learner.step()
        await until(lambda: learner.judging is not None and learner.judging.done(), "the verdict")
        assert rig.batches()[0]["record_ids"] == ids[-4:]
        assert learner.stats.dropped["superseded"] == 6

    run_with_rig(tmp_path, tiny_model_dir, body)


@pytest.mark.parametrize("first", ["losing", "promising"])
def test_two_batches_open_at_a_crash_are_resumed_in_order(tiny_model_dir: Path, tmp_path: Path, first: str) -> None:
    async def body(rig: Rig) -> None:
        for name in ("b1", "b2"):  # what a learner had logged when the process died
            ids = await rig.feed(4)
            rig.chain.begin_batch(name, ids, [], high_water=rig.fed, expected_step=rig.chain.last_step(), max_open=2)
        verdict = LOSING if first == "losing" else PROMISING
        gate = ScriptedGate(("reject", verdict), ("select", PROMISING))
        await rig.learner(gate).recover()
        if first == "losing":
            assert rig.closers() == [("rejection", "b1"), ("abandon", "b2")]
        else:
            assert rig.closers() == [("rejection", "b1"), ("training", "b2")]
        assert rig.chain.open_batches() == []
        trained = [rid for b in rig.batches() for rid in b["record_ids"]]
        assert len(trained) == len(set(trained))

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_a_batch_that_fails_to_train_after_a_restart_is_abandoned_and_the_next_resumed(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    async def body(rig: Rig) -> None:
        bad = await rig.feed(3)
        broken = "broken0"  # one log-prob for two tokens: the trainer refuses the batch
        head = rig.chain.head().ref
        release = ReleaseRef(head.release_id, head.content_id, "load-test")
        rig.state.store.put_record(Record(broken, "s", release, {"temperature": 1.0, "messages": []}))
        rig.state.store.finish_record(
            broken,
            RecordStatus.COMPLETE,
            response={"prompt_token_ids": PROMPT},
            token_ids=[300, 2],
            logprobs=[-1.0],
            spans=[TokenSpan(0, 2, "load-test")],
        )
        rig.state.store.put_report(Report("rep-broken", "s", (broken,), 1.0))
        rig.chain.begin_batch(
            "b1", [*bad, broken], [], high_water=rig.fed, expected_step=rig.chain.last_step(), max_open=2
        )
        good = await rig.feed(4)
        rig.chain.begin_batch("b2", good, [], high_water=rig.fed, expected_step=rig.chain.last_step(), max_open=2)
        learner = rig.learner(ScriptedGate(("select", PROMISING)))
        await learner.recover()
        assert rig.closers() == [("abandon", "b1"), ("training", "b2")]
        assert "training failed" in rig.chain.history()[-2].metrics["reason"]
        assert learner.stats.last_error and rig.chain.open_batches() == []

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_three_batches_open_at_a_crash_resume_and_the_gate_takes_the_newest(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    async def body(rig: Rig) -> None:
        for name in ("b1", "b2", "b3"):  # at the gate, waiting, in training when the process died
            ids = await rig.feed(4)
            rig.chain.begin_batch(name, ids, [], high_water=rig.fed, expected_step=rig.chain.last_step(), max_open=3)
        gate = ScriptedGate(("reject", PROMISING), ("select", PROMISING))
        learner = rig.learner(gate)
        gate.hold.clear()
        recovering = asyncio.create_task(learner.recover())
        await until(lambda: learner.waiting is not None and learner.waiting[0].batch_id == "b3", "b3 waiting")
        gate.hold.set()
        await recovering
        assert rig.closers() == [("abandon", "b2"), ("rejection", "b1"), ("training", "b3")]
        assert rig.chain.open_batches() == []

    run_with_rig(tmp_path, tiny_model_dir, body)


def test_publishing_moves_the_head_and_leaves_serving_it_to_the_server(tmp_path: Path) -> None:
    """The publisher only writes the chain (commit never calls into serve): a selected candidate
    becomes the head, and the serving pointer moves only when the server follows the head."""
    with ReefState.open(tmp_path / "state") as state:
        chain = state.create("s", "sao")
        start = chain.head().release_id
        publisher = CandidatePublisher(chain, ScriptedGate(("select", PROMISING)))  # type: ignore[arg-type]
        candidate = LearnedCandidate("s", "b1", "sao", {"adapter_model.safetensors": b"a"}, start, {}, 0)
        verdict = asyncio.run(publisher.decide(candidate))
        assert verdict.decision == "select" and chain.head().release_id != start
        assert chain.serving().release_id == start
