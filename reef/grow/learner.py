"""The weights learner of one scenario: reported records in, candidate adapters out.

One loop, in a fixed, visible order: read new reports since the cursor, let the recipe turn
them into samples (or count why not), and once there are enough for a candidate: log the batch
(invariant 9, before any training), train `steps_per_candidate` optimiser steps in the training
process, and hand the adapter to the publisher (the gate, then publish or reject, which closes
the batch in the log). On start, a batch the log shows open is resumed if its records are all
still there, and abandoned (logged) otherwise. Serving never waits on any of this.
"""

from __future__ import annotations

import asyncio
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
from reef.grow.trainer import Sample
from reef.grow.loop import keep_stepping
from reef.grow.worker import TrainingWorker

log = logging.getLogger("reef.learner")
HOLDOUT_KEEP = 64
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


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
    def begin_batch(self, batch_id: str, record_ids: list[str], report_ids: list[str], *, high_water: int,
                    expected_step: int) -> Any: ...
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
        self.working: dict[str, bytes] | None = None  # the adapter being trained, once it differs from the head
        self.working_head: str | None = None  # the head `working` continues from; a rollback resets it

    async def run(self) -> None:
        await self.recover()
        await keep_stepping(f"learner {self.scenario}", self.step, self.stats, self.poll_interval)

    async def recover(self) -> None:
        """Resume the batch the log shows open, or abandon it (logged) if it cannot be."""
        batch = self.chain.open_batch()
        if batch is None:
            return
        try:
            items = [self._rescore(rid) for rid in batch["record_ids"]]
        except NotFound as exc:
            await asyncio.to_thread(self.chain.abandon_batch, batch["batch_id"], f"cannot resume after restart: {exc}")
            self.stats.abandoned += 1
            return
        log.info("learner %s: resuming batch %s after a restart", self.scenario, batch["batch_id"])
        await self._train(items, batch["batch_id"], int(batch.get("high_water", self.cursor)), logged=True)

    async def step(self) -> bool:
        """Take in new reports; train a candidate when there are enough samples. True if it did work."""
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
            self.stats.state = "collecting"
            return bool(items)
        # The newest samples: the policy gradient is only as good as its samples are close to the
        # policy being trained, so what waited behind them is superseded, not trained later.
        batch, superseded, self.pending = self.pending[-size:], self.pending[:-size], []
        self.stats.dropped["superseded"] += len(superseded)
        await self._train(batch, new_id(), self.cursor, logged=False)
        return True

    async def _train(self, batch: list[ScoredSample], batch_id: str, high_water: int, logged: bool) -> None:
        if not logged:
            self.stats.state = "logging batch"
            await asyncio.to_thread(self.chain.begin_batch, batch_id, [s.record_id for s in batch],
                                    sorted({s.report_id for s in batch}), high_water=high_water,
                                    expected_step=self.chain.last_step())
        self.consumed.update(s.record_id for s in batch)
        samples, state = self.recipe.with_advantages(batch, self.chain.algorithm_state())
        if self.chain.head().release_id != self.working_head:  # someone else moved the head (a rollback)
            self.working = None
        files = self.working if self.working is not None else _adapter_only(await self.head_files())
        self.stats.state = "training"
        started, metrics = time.monotonic(), {}
        step_size = self.recipe.config.batch_size
        for start in range(0, len(samples), step_size):
            files, metrics = await self.worker.train(self.scenario, files or None, samples[start:start + step_size],
                                                     self.recipe.train_config())
        self.stats.last_train_seconds = round(time.monotonic() - started, 3)
        self.working = files
        self.stats.state, self.stats.candidates = "evaluating", self.stats.candidates + 1
        holdout = [(s.score, s.sample) for s in self.holdout]
        verdict = await self.decide(TrainedCandidate(self.scenario, batch_id, files, dict(metrics), state,
                                                     high_water, holdout))
        self.stats.last_verdict = {"decision": verdict.decision,
                                   **{k: v for k, v in verdict.metrics.items() if k != "per_task"}}
        self.working_head = self.chain.head().release_id
        if verdict.decision == "select":
            self.stats.published += 1
        else:
            self.stats.rejected += 1
            if not _promising(verdict):
                self.working = None  # it lost: the next candidate starts again from the head
        self.stats.state = "collecting"

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
    """A rejected candidate worth training on from: it won more of the gate's paired tasks than
    it lost, only not by enough. Anything else would keep a drift the gate has seen fail."""
    return int(verdict.metrics.get("wins", 0)) > int(verdict.metrics.get("losses", 0))


def _adapter_only(files: dict[str, bytes]) -> dict[str, bytes]:
    """A release's content as the trainer takes it: the adapter files, or nothing (the base)."""
    return {name: data for name, data in files.items() if name in ADAPTER_FILES}
