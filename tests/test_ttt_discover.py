"""The `ttt_discover` recipe on a real state directory and the real training process (tiny
model), the gate's verdicts scripted: groups reported out of order are trained once complete,
an incomplete group is not, a group spanning two releases is refused with the reason in the
commit log; and its advantages, leave-one-out and entropic."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

from reef.commit.publisher import CandidatePublisher
from reef.commit.state import ReefState
from reef.core.types import Operation, Record, RecordStatus, ReleaseRef, Report, TokenSpan, Verdict
from reef.grow.training_client import TrainingClient
from reef.grow.worker import TrainingWorker
from reef.recipes.ttt_discover import TTTDiscoverConfig, TTTDiscoverRecipe, entropic_advantages, leave_one_out
from reef.serve.learning import wire_learner

PROMPT = [1, 4093, 198, 19556, 314, 216, 33, 30, 2, 198, 1, 520, 9531, 198]  # any ids the tiny model knows


def test_leave_one_out_and_entropic_advantages() -> None:
    assert leave_one_out([1.0, 0.0, 0.0]) == [1.0, -0.5, -0.5]
    assert leave_one_out([0.3, 0.3]) == [0.0, 0.0]
    sharp = entropic_advantages([1.0, 0.0, 0.0, 0.0], math.log(2))
    assert sharp[0] > 1.0 and sharp[1] == sharp[2] == sharp[3] and -1.0 < sharp[1] < 0
    weights = [a + 1 for a in entropic_advantages([0.9, 0.8, 0.1, 0.0], math.log(2))]  # w_i / mean of the others
    assert weights == sorted(weights, reverse=True)  # the better, the heavier
    assert entropic_advantages([0.5] * 4, math.log(2)) == [0.0] * 4


class Gate:
    """Selects every candidate; keeps what it was shown."""

    def __init__(self) -> None:
        self.judged: list[Any] = []

    def remember(self, releases: Any) -> None:
        return None

    async def judge(
        self,
        current: Any,
        current_files: Any,
        candidate_id: str,
        candidate_files: Any,
        holdout: Any,
        starved: bool = False,
        live: Any = None,
        thresholds: Any = None,
    ) -> Verdict:
        self.judged.append(candidate_id)
        return Verdict("select", {"gate": "test"})


async def report(
    state: ReefState, worker: TrainingWorker, release: ReleaseRef, step: int, group: int, rollout: int, score: float
) -> str:
    """One rollout served by `release` (on-policy log-probs of the base model) and its score,
    with its place in the search in the report's metadata."""
    rid = f"s{step}g{group}r{rollout}"
    completion = [300 + 10 * group + rollout, 301, 2]
    logprobs = (await worker.logprobs(None, [(PROMPT, completion)]))[0]
    state.store.put_record(Record(rid, "t", release, {"temperature": 1.0, "messages": []}))
    state.store.finish_record(
        rid,
        RecordStatus.COMPLETE,
        response={"prompt_token_ids": PROMPT},
        token_ids=completion,
        logprobs=logprobs,
        spans=[TokenSpan(0, len(completion), release.runtime_load_id or "")],
    )
    metadata = {"step": step, "group": group, "rollout": rollout, "group_size": 3}
    state.store.put_report(Report(f"rep-{rid}", "t", (rid,), score, metadata=metadata))
    return rid


def test_groups_out_of_order_incomplete_and_spanning_two_releases(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def main() -> None:
        worker = TrainingWorker(tiny_model_dir, threads=1)
        await worker.start()
        try:
            with ReefState.open(tmp_path / "state") as state:
                await scenario(state, worker)
        finally:
            await worker.close()

    async def scenario(state: ReefState, worker: TrainingWorker) -> None:
        chain = state.create("t", "ttt_discover")
        head = chain.head().ref
        first = ReleaseRef(head.release_id, head.content_id, "load-1")
        gate = Gate()

        publisher = CandidatePublisher(chain, gate)  # type: ignore[arg-type]
        recipe = TTTDiscoverRecipe(TTTDiscoverConfig(group_size=3, lr=0.01))
        learner = wire_learner(
            chain,
            state.store,
            recipe,
            publisher.decide,
            publisher.head_files,
            TrainingClient(worker, "t"),
            poll_interval=0.05,
        )
        # group 0 starts first but misses rollout 1; group 1 arrives interleaved, last rollout first
        for group, rollout, score in [(0, 0, 1.0), (1, 2, 0.0), (0, 2, 0.0), (1, 0, 1.0), (1, 1, 0.5)]:
            await report(state, worker, first, 0, group, rollout, score)
        assert await learner.step() is True
        assert learner.judging is not None
        await learner.judging  # the publication, before looking at the chain
        batches = [e.batch for e in chain.history() if e.operation is Operation.BATCH]
        assert [b["record_ids"] for b in batches] == [["s0g1r0", "s0g1r1", "s0g1r2"]]  # in rollout order
        training = chain.releases()[0]
        assert training.operation is Operation.TRAINING and training.metrics["groups"] == ["step 0 group 1"]
        assert training.metrics["training"]["tokens"] == 9 and training.metrics["training"]["kl"] >= 0
        assert learner.status()["open_groups"] == 1  # group 0 waits, untrained

        # group 0's last rollout comes from the new release: the group spans two, and is refused
        second = ReleaseRef(training.release_id, training.content_id, "load-2")
        await report(state, worker, second, 0, 0, 1, 0.5)
        assert await learner.step() is True
        last = chain.history()[-1]
        assert last.operation is Operation.ABANDON
        assert last.metrics["reason"].startswith("mixed_releases: step 0 group 0 spans 2 releases")
        refused = [e.batch for e in chain.history() if e.operation is Operation.BATCH][-1]
        assert sorted(refused["record_ids"]) == ["s0g0r0", "s0g0r1", "s0g0r2"]  # consumed, never trained
        assert len(gate.judged) == 1 and learner.status()["open_groups"] == 0 and chain.open_batches() == []

    asyncio.run(main())
