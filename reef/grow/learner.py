"""The weights learner of one scenario: reported records in, candidate adapters out.

One loop, in a fixed, visible order: read new reports since the cursor, let the recipe turn
them into samples (or count why not), and once there are enough for a candidate: log the batch
(invariant 9, before any training), train `steps_per_candidate` optimiser steps in the training
process, and hand the adapter to the publisher (the gate, then publish or reject, which closes
the batch in the log). The gate judges in the background while the next candidate trains on
from the last one, so the training process does not idle through every evaluation: at most
two batches are open, one at the gate and one in training. A candidate trained from one the
gate then rejected as no better is abandoned (logged) unjudged. On start, the batches the log
shows open are resumed in order if their records are all still there, and abandoned (logged)
otherwise. Serving never waits on any of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from reef.core.canonical import new_id
from reef.core.errors import NotFound
from reef.core.types import Verdict
from reef.observe.store import ExperienceStore
from reef.recipes.sao import SAORecipe, ScoredSample
from reef.core.training import Sample, checkpoint_part
from reef.grow.loop import keep_stepping
from reef.grow.worker import TrainingWorker

log = logging.getLogger("reef.learner")
HOLDOUT_KEEP = 64
WORSE_P = 0.05  # a rejected candidate is trained on unless the gate is this sure it is worse


@dataclass
class TrainedCandidate:
    scenario: str
    batch_id: str
    files: dict[str, bytes]
    metrics: dict[str, Any]
    algorithm_state: dict[str, Any]
    high_water: int
    holdout: list[tuple[float, Sample]]


class Chain(Protocol):  # the parts of commit's ReleaseChain a learner uses
    scenario: str

    def last_step(self) -> int: ...
    def head(self) -> Any: ...
    def high_water(self) -> int: ...
    def algorithm_state(self) -> dict | None: ...
    def open_batch(self) -> dict | None: ...
    def consumed_record_ids(self) -> set[str]: ...
    def releases(self) -> list[Any]: ...
    def open_batches(self) -> list[dict]: ...
    def begin_batch(self, batch_id: str, record_ids: list[str], report_ids: list[str], *, high_water: int,
                    expected_step: int, max_open: int = 1) -> Any: ...
    def abandon_batch(self, batch_id: str, reason: str) -> Any: ...


Decide = Callable[[TrainedCandidate], Awaitable[Verdict]]
HeadFiles = Callable[[], Awaitable[dict[str, bytes]]]


@dataclass
class LearnerStats:
    state: str = "starting"
    pending_samples: int = 0
    held_out: int = 0
    candidates: int = 0
    published: int = 0
    rejected: int = 0
    abandoned: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    last_verdict: dict[str, Any] | None = None
    last_error: str | None = None
    last_train_seconds: float | None = None
    last_metrics: dict[str, Any] = field(default_factory=dict)


class WeightsLearner:
    def __init__(self, chain: Chain, store: ExperienceStore, recipe: SAORecipe, worker: TrainingWorker,
                 decide: Decide, head_files: HeadFiles, poll_interval: float = 0.5) -> None:
        self.chain = chain
        self.scenario = chain.scenario
        self.store = store
        self.recipe = recipe
        self.worker = worker
        self.decide = decide
        self.head_files = head_files
        self.poll_interval = poll_interval
        self.stats = LearnerStats()
        self.pending: list[ScoredSample] = []
        self.holdout: deque[ScoredSample] = deque(maxlen=HOLDOUT_KEEP)
        self.cursor = chain.high_water()
        self.consumed = chain.consumed_record_ids()
        self.algorithm_state = chain.algorithm_state()  # ahead of the log while a candidate is judged
        self.working: dict[str, bytes] | None = None  # the adapter being trained, once it differs from the head
        self.working_head: str | None = None  # the head `working` continues from; a rollback resets it
        self.lineage = 0  # bumped whenever `working` is dropped: candidates trained from it are void
        self.drop_reason = ""
        self.judging: asyncio.Task[None] | None = None  # the candidate at the gate, while the next one trains

    async def run(self) -> None:
        try:
            await self.recover()
            await keep_stepping(f"learner {self.scenario}", self.step, self.stats, self.poll_interval)
        finally:
            if self.judging is not None:
                self.judging.cancel()

    async def recover(self) -> None:
        """Resume the batches the log shows open, oldest first, or abandon them (logged)."""
        for batch in self.chain.open_batches():
            try:
                items = [self._rescore(rid) for rid in batch["record_ids"]]
            except NotFound as exc:
                await self._abandon(batch["batch_id"], f"cannot resume after restart: {exc}")
                continue
            log.info("learner %s: resuming batch %s after a restart", self.scenario, batch["batch_id"])
            try:
                await self._train(items, batch["batch_id"], int(batch.get("high_water", self.cursor)), logged=True)
            except Exception as exc:  # noqa: BLE001 - abandoned by _train; the next batch and learning go on
                log.exception("learner %s: resuming batch %s failed", self.scenario, batch["batch_id"])
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
        await self._judged()

    async def step(self) -> bool:
        """Take in new reports; train a candidate when there are enough samples. True if it did work."""
        if self.judging is not None and self.judging.done():
            await self._judged()
        items = self.store.reported_since(self.scenario, self.cursor, limit=512)
        if items:
            positions = {r.release_id: i for i, r in enumerate(self.chain.releases())}  # 0 = the head
            intake = self.recipe.intake(items, positions.get, self.consumed)
            self.cursor = items[-1].cursor
            self.pending.extend(intake.samples)
            self.holdout.extend(intake.held_out)
            self.stats.dropped.update(intake.dropped)
        self.stats.pending_samples, self.stats.held_out = len(self.pending), len(self.holdout)
        size = self.recipe.candidate_size
        if len(self.pending) < size:
            self.stats.state = "collecting" if self.judging is None else "evaluating"
            return bool(items)
        # The newest samples: the policy gradient is only as good as its samples are close to the
        # policy being trained, so what waited behind them is superseded, not trained later.
        batch, superseded, self.pending = self.pending[-size:], self.pending[:-size], []
        self.stats.dropped["superseded"] += len(superseded)
        await self._train(batch, new_id(), self.cursor, logged=False)
        return True

    async def _train(self, batch: list[ScoredSample], batch_id: str, high_water: int, logged: bool) -> None:
        """Train a candidate on `batch` and send it to the gate. The gate judges in the
        background while the next candidate trains (from this one); at most one is judged at a
        time, so this waits for the previous verdict before handing its own candidate over."""
        if not logged:
            self.stats.state = "logging batch"
            await asyncio.to_thread(self.chain.begin_batch, batch_id, [s.record_id for s in batch],
                                    sorted({s.report_id for s in batch}), high_water=high_water,
                                    expected_step=self.chain.last_step(), max_open=2)
        self.consumed.update(s.record_id for s in batch)
        samples, self.algorithm_state = self.recipe.with_advantages(batch, self.algorithm_state)
        state = self.algorithm_state
        if self.judging is None and self.chain.head().release_id != self.working_head:
            self._drop_working("the head moved (a rollback)")
        lineage = self.lineage
        try:
            files = await self._train_steps(samples)
        except Exception as exc:
            await self._abandon(batch_id, f"training failed: {type(exc).__name__}: {exc}")
            raise
        self.stats.state = "evaluating"
        await self._judged()
        if lineage != self.lineage:  # the candidate it trained on from was dropped meanwhile
            await self._abandon(batch_id, f"trained on from a candidate that was dropped: {self.drop_reason}")
            return
        self.working = files
        self.stats.candidates += 1
        candidate = TrainedCandidate(self.scenario, batch_id, files, dict(self.stats.last_metrics), dict(state),
                                     high_water, [(s.score, s.sample) for s in self.holdout])
        self.judging = asyncio.get_running_loop().create_task(self._judge(candidate), name=f"gate:{self.scenario}")

    async def _train_steps(self, samples: list[Sample]) -> dict[str, bytes]:
        files = self.working if self.working is not None else checkpoint_part(await self.head_files())
        self.stats.state = "training"
        started = time.monotonic()
        step_size = self.recipe.config.batch_size
        for start in range(0, len(samples), step_size):
            files, self.stats.last_metrics = await self.worker.train(
                self.scenario, files or None, samples[start:start + step_size], self.recipe.train_config())
        self.stats.last_train_seconds = round(time.monotonic() - started, 3)
        return files

    async def _judge(self, candidate: TrainedCandidate) -> None:
        """The gate, then publish or reject (which closes the batch in the log)."""
        try:
            verdict = await self.decide(candidate)
        except Exception as exc:
            self._drop_working(f"its evaluation failed ({type(exc).__name__})")
            await self._abandon(candidate.batch_id, f"evaluation failed: {type(exc).__name__}: {exc}")
            raise
        self.stats.last_verdict = {"decision": verdict.decision,
                                   **{k: v for k, v in verdict.metrics.items() if k != "per_task"}}
        self.working_head = self.chain.head().release_id
        if verdict.decision == "select":
            self.stats.published += 1
        else:
            self.stats.rejected += 1
            if not _promising(verdict):  # the next candidate starts again from the head
                self._drop_working("the gate found it worse than the serving release")

    async def _judged(self) -> None:
        """Wait for the candidate at the gate, if any; a failure there is shown, not raised."""
        task, self.judging = self.judging, None
        if task is None:
            return
        try:
            await task
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged and shown; its batch is abandoned
            log.exception("learner %s: evaluation failed", self.scenario)
            self.stats.last_error = f"{type(exc).__name__}: {exc}"

    def _drop_working(self, reason: str) -> None:
        self.working, self.lineage, self.drop_reason = None, self.lineage + 1, reason

    async def _abandon(self, batch_id: str, reason: str) -> None:
        with contextlib.suppress(NotFound):
            await asyncio.to_thread(self.chain.abandon_batch, batch_id, reason)
        self.stats.abandoned += 1

    def _rescore(self, record_id: str) -> ScoredSample:
        """Rebuild a logged batch's sample from the store (its record and latest report)."""
        record = self.store.get_record(record_id)
        reports = self.store.reports_for(record_id)
        if not reports:
            raise NotFound(f"record {record_id} has no report")
        intake_sample = self.recipe.sample_of(record)
        report = reports[-1]
        return ScoredSample(record_id, report.id, report.seq or 0, report.score, intake_sample)

    def status(self) -> dict[str, Any]:
        s = self.stats
        return {"scenario": self.scenario, "recipe": self.recipe.name, "state": s.state, "cursor": self.cursor,
                "pending_samples": s.pending_samples, "held_out": s.held_out, "candidates": s.candidates,
                "published": s.published, "rejected": s.rejected, "abandoned": s.abandoned,
                "dropped": dict(s.dropped), "last_verdict": s.last_verdict, "last_error": s.last_error,
                "last_train_seconds": s.last_train_seconds, "training_queue": self.worker.pending().get(self.scenario, 0)}


def _promising(verdict: Verdict) -> bool:
    """A rejected candidate worth training on from: one the gate could not show to be worse than
    the serving release (`p_worse` above WORSE_P: a few more losses than wins on a small task
    set is noise, and throwing the candidate away would throw away every step it took). A
    candidate the gate is sure is worse is dropped, so a drift away from the task is not built on.
    Without the paired test (the offline check), only one that won more than it lost."""
    p_worse = verdict.metrics.get("p_worse")
    if p_worse is not None:
        return float(p_worse) > WORSE_P
    return int(verdict.metrics.get("wins", 0)) > int(verdict.metrics.get("losses", 0))
