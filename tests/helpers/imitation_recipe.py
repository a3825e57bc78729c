"""A recipe written outside reef, as a user would: imitate the well-scored answers.

Supervised fine-tuning through the training primitives: every answer scored at least
`min_score` is a target of the `cross_entropy` loss; `batch_size` of them make a candidate after
`steps` optimiser steps. A hash-chosen fraction of records (all scores) is held out for the
gate's offline check. Named in the config by its dotted path,
`tests.helpers.imitation_recipe:ImitationRecipe`, with its settings under that key in `learner:`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from pydantic import BaseModel, ConfigDict, Field

from reef.core.provenance import verified
from reef.core.training import AdamParams, Datum, LoraShape, LossConfig, Rollout
from reef.core.types import JSON, Record, RecordStatus, ReportedRecords
from reef.grow.recipe import Job, LearnerView, Made, RecipeContext, held_out


class ImitationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_score: float = Field(1.0, description="Answers scored at least this are imitated")
    batch_size: int = Field(4, ge=1)
    steps: int = Field(2, ge=1, description="Optimiser steps over the batch per candidate")
    lr: float = Field(1e-3, gt=0)


@dataclass(frozen=True)
class Target:
    record_id: str
    report_id: str
    report_seq: int
    score: float
    prompt_ids: list[int]
    completion_ids: list[int]

    def datum(self) -> Datum:
        n = len(self.completion_ids)
        return Datum(self.prompt_ids, self.completion_ids, [], [0.0] * n, [1.0] * n)

    def rollout(self) -> Rollout:  # the gate's offline check reads (prompt, completion)
        return Rollout(self.record_id, "", self.prompt_ids, self.completion_ids, [0.0] * len(self.completion_ids))


@dataclass(frozen=True)
class Targets:
    items: list[Target]

    @property
    def record_ids(self) -> list[str]:
        return [t.record_id for t in self.items]

    @property
    def report_ids(self) -> list[str]:
        return sorted({t.report_id for t in self.items})


class ImitationRecipe:
    name = "imitation"
    surface = "weights"
    Settings = ImitationConfig

    def __init__(self, config: ImitationConfig, context: RecipeContext) -> None:
        self.config = config
        self.holdout_fraction = 0.0 if context.gate.tasks else context.gate.holdout_fraction
        self.waiting: list[Target] = []
        self.holdout: deque[Target] = deque(maxlen=64)

    def intake(self, items: Sequence[ReportedRecords], view: LearnerView) -> None:
        for item in items:
            for record in item.records:
                if (
                    record.id in view.consumed
                    or record.status is not RecordStatus.COMPLETE
                    or not record.token_ids
                    or not verified(record)
                ):
                    view.drop("not_usable")
                    continue
                target = target_of(record, item)
                if held_out(record.id, self.holdout_fraction):
                    self.holdout.append(target)
                elif target.score < self.config.min_score:
                    view.drop("low_score")
                else:
                    self.waiting.append(target)

    async def next_batch(self, view: LearnerView) -> Targets | None:
        if len(self.waiting) < self.config.batch_size:
            return None
        batch, self.waiting = self.waiting[: self.config.batch_size], self.waiting[self.config.batch_size :]
        return Targets(batch)

    def resume(self, items: Sequence[ReportedRecords]) -> Targets:
        return Targets([target_of(item.records[0], item) for item in items])

    def high_water(self, cursor: int) -> int:
        """Below the reports still waiting, so a restart reads them again."""
        return min(t.report_seq for t in self.waiting) - 1 if self.waiting else cursor

    async def candidate(self, batch: Targets, job: Job) -> Made:
        assert job.trainer is not None
        await job.trainer.load_state(job.start, LoraShape(r=8, alpha=16))
        metrics: dict[str, float] = {}
        for _ in range(self.config.steps):
            metrics = await job.trainer.forward_backward(
                [t.datum() for t in batch.items], "cross_entropy", LossConfig()
            )
            metrics.update(await job.trainer.optim_step(AdamParams(lr=self.config.lr)))
        return Made(
            await job.trainer.save_state(),
            metrics={"training": metrics},
            held_out=[(t.score, t.rollout()) for t in self.holdout],
        )

    def status(self) -> JSON:
        return {"waiting": len(self.waiting), "held_out": len(self.holdout)}

    async def close(self) -> None:
        return None


def target_of(record: Record, item: ReportedRecords) -> Target:
    prompt = list((record.response or {}).get("prompt_token_ids") or [])
    return Target(
        record.id, item.report.id, item.cursor, float(item.report.score), prompt, list(record.token_ids or [])
    )
