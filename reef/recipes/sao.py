"""SAO: single-rollout asynchronous policy optimisation, on a LoRA adapter.

Each scored record is one sample as soon as its report arrives: no sibling groups, no barrier.
Its advantage is the score minus a running baseline (an exponential moving average kept in the
commit log's algorithm state, so a restart resumes it). `batch_size` samples make one
optimiser step of the `cispo` loss: a token-level policy gradient with importance ratios
against the recorded rollout log-probs, each token's gradient weighted by its ratio truncated at
`1 + eps_clip_high`, with an optional KL penalty to the base model; `steps_per_candidate` steps
make one candidate for the gate. Its later steps train on samples a few steps older than the
weights, and samples come from a candidate or a release behind them, so every token must still
count: `loss: ppo` (PPO's clipped surrogate) gives no gradient to a token already made likelier
than its clip allows, and `loss: clipped_is` masks every token past the clip, which the learning
race (bench/learning_race.py) measured to slow learning. A batch is the newest samples: what
waited behind them is superseded.

A record is a sample only if it can be trained on honestly: complete, with token ids, log-probs
and the prompt's token ids, its spans verified against the release it was frozen to
(invariant 2), sampled without top-p, produced by a release at most `max_staleness`
publications old, and not trained on before. Every dropped record is counted by reason. A fixed
hash-chosen fraction of records is held out of training for the gate's offline check.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from pydantic import Field

from reef.config.training import ClippedLossConfig
from reef.core.training import Datum, TrainConfig
from reef.core.types import JSON, Record, ReportedRecords
from reef.grow.recipe import (
    Job,
    LearnerView,
    Made,
    RecipeContext,
    held_out,
    missing_records,
    offline_holdout_fraction,
)
from reef.grow.rollouts import ScoredRollout, rollout_of, rollout_problem, staleness_problem

NAME = "sao"
HOLDOUT_KEEP = 64
BASELINE_DECAY = 0.9  # of the running score baseline, an EMA over samples


class SAOConfig(ClippedLossConfig):
    """Knobs of the `sao` recipe: `learner.sao` (docs/learning.md explains each); the LoRA shape,
    optimiser and clip range are every weights recipe's (reef/config/training.py)."""

    batch_size: int = Field(8, ge=1, description="Scored samples per optimiser step")
    steps_per_candidate: int = Field(
        2,
        ge=1,
        description="Optimiser steps before the gate judges the adapter "
        "(and the canary serves it): fewer keep samples closer to the weights",
    )
    loss: Literal["cispo", "ppo", "clipped_is"] = Field(
        "cispo",
        description="cispo: every token's gradient, weighted by its ratio truncated at 1 + eps_clip_high; "
        "ppo: PPO's clipped surrogate over every token; clipped_is: tokens whose ratio left the clip range are masked out",
    )


@dataclass(frozen=True)
class SAOBatch:
    items: list[ScoredRollout]

    @property
    def record_ids(self) -> list[str]:
        return [s.record_id for s in self.items]

    @property
    def report_ids(self) -> list[str]:
        return sorted({s.report_id for s in self.items})


class SAORecipe:
    name = NAME
    surface = "weights"
    harness_gate = None  # judged by the weights gate (learner.gate)
    Settings = SAOConfig

    def __init__(self, config: SAOConfig, context: RecipeContext | None = None) -> None:
        self.config = config
        self.holdout_fraction = offline_holdout_fraction(context)
        self.pending: list[ScoredRollout] = []
        self.holdout: deque[ScoredRollout] = deque(maxlen=HOLDOUT_KEEP)
        self.last_train_seconds: float | None = None

    def train_config(self) -> TrainConfig:
        c = self.config
        return TrainConfig(
            lora=c.lora,
            lr=c.lr,
            eps_clip=c.eps_clip,
            eps_clip_high=c.eps_clip_high,
            kl_coef=c.kl_coef,
            micro_batch=c.batch_size,
            loss=c.loss,
        )

    @property
    def candidate_size(self) -> int:
        return self.config.batch_size * self.config.steps_per_candidate

    # -- eligibility ----------------------------------------------------------------------------

    def intake(self, items: Sequence[ReportedRecords], view: LearnerView) -> None:
        for item in items:
            if missing_records(item):
                view.drop("compacted_or_missing", missing_records(item))
            for record in item.records:
                reason = self._ineligible(record, view)
                if reason:
                    view.drop(reason)
                    continue
                scored = ScoredRollout(item.report.id, item.cursor, item.report.score, rollout_of(record))
                waiting = self.holdout if held_out(record.id, self.holdout_fraction) else self.pending
                self._replace_earlier_report(waiting, record.id, view)
                waiting.append(scored)

    @staticmethod
    def _replace_earlier_report(
        waiting: list[ScoredRollout] | deque[ScoredRollout], record_id: str, view: LearnerView
    ) -> None:
        """Two reports on one record (a client retrying without a report_id) make one sample, scored
        by the later report: a batch never trains on one record twice."""
        for i, sample in enumerate(waiting):
            if sample.record_id == record_id:
                del waiting[i]
                view.drop("rescored")
                return

    def _ineligible(self, record: Record, view: LearnerView) -> str | None:
        problem = rollout_problem(record, view.consumed)
        if problem is None and record.release is not None:
            problem = staleness_problem(record.release.release_id, view, self.config.max_staleness)
        return problem

    # -- batches ------------------------------------------------------------------------------

    async def next_batch(self, view: LearnerView) -> SAOBatch | None:
        size = self.candidate_size
        if len(self.pending) < size:
            return None
        # The newest samples: the policy gradient is only as good as its samples are close to the
        # policy being trained, so what waited behind them is superseded, not trained later.
        batch, superseded, self.pending = self.pending[-size:], self.pending[:-size], []
        view.drop("superseded", len(superseded))
        return SAOBatch(batch)

    def resume(self, items: Sequence[ReportedRecords]) -> SAOBatch:
        return SAOBatch(
            [
                ScoredRollout(item.report.id, item.cursor, item.report.score, rollout_of(item.records[0]))
                for item in items
            ]
        )

    def high_water(self, cursor: int) -> int:
        return cursor  # nothing waits here past a batch: the rest was superseded

    # -- the candidate --------------------------------------------------------------------------

    async def candidate(self, batch: SAOBatch, job: Job) -> Made:
        """`steps_per_candidate` optimiser steps of the configured loss, on from `job.start`."""
        assert job.trainer is not None
        data, job.algorithm_state = self.with_advantages(batch.items, job.algorithm_state)
        c, started = self.train_config(), time.monotonic()
        await job.trainer.load_state(job.start, c.lora)
        metrics: dict[str, float] = {}
        for start in range(0, len(data), self.config.batch_size):
            chunk = data[start : start + self.config.batch_size]
            metrics = await job.trainer.forward_backward(chunk, c.loss, c.loss_config)
            metrics.update(await job.trainer.optim_step(c.adam))
        files = await job.trainer.save_state()
        self.last_train_seconds = round(time.monotonic() - started, 3)
        return Made(files, metrics={"training": metrics}, held_out=[(s.score, s.rollout) for s in self.holdout])

    def with_advantages(
        self, batch: list[ScoredRollout], state: dict[str, Any] | None
    ) -> tuple[list[Datum], dict[str, Any]]:
        """Advantage = score - running baseline, the baseline updated sample by sample."""
        state = dict(state or {})
        baseline = state.get("baseline")
        if baseline is None:
            baseline = sum(s.score for s in batch) / len(batch)
        decay = BASELINE_DECAY
        data = []
        for item in batch:
            data.append(item.rollout.datum(item.score - baseline))
            baseline = decay * baseline + (1 - decay) * item.score
        state.update(
            baseline=baseline,
            samples_seen=int(state.get("samples_seen", 0)) + len(batch),
            candidates=int(state.get("candidates", 0)) + 1,
        )
        return data, state

    def status(self) -> JSON:
        return {
            "pending_samples": len(self.pending),
            "held_out": len(self.holdout),
            "last_train_seconds": self.last_train_seconds,
        }

    async def close(self) -> None:
        return None
