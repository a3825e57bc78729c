"""The SAO recipe, as bench/learning_race.py's `--line` runs it: every candidate's adapter is
also written to `line_dir`, named by the wall-clock second it was made, so the race can measure
the line the learner trains (the newest candidate at each snapshot) beside the release the gate
let serve. Bound by its dotted path (`race_line:LineSAO`), like any recipe of a user's own.

With `fresh: N` (the race's `--fresh N`), a batch waits until N of its samples were served by the
canary of the candidate made last, the one the next trains on from (at most `fresh_max_wait`
seconds after it was made; the canary may stop meanwhile), and those come last in the batch (its
last step). With N = the batch's size (`batch_size` x `steps_per_candidate`) every sample is that
candidate's own, none the one's before it, at the cost of the wait."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from pydantic import Field

from reef.core.training import ADAPTER_WEIGHTS
from reef.core.types import ReportedRecords
from reef.grow.canary import canary_release_id
from reef.grow.recipe import Job, LearnerView, Made, RecipeContext
from reef.recipes.sao import SAOBatch, SAOConfig, SAORecipe


class LineConfig(SAOConfig):
    line_dir: str
    fresh: int = Field(0, ge=0, description="Samples of the newest candidate's canary a batch waits for (0: none)")
    fresh_max_wait: float = Field(15.0, gt=0, description="Seconds after that candidate was made")


class LineSAO(SAORecipe):
    Settings = LineConfig
    config: LineConfig

    def __init__(self, config: LineConfig, context: RecipeContext | None = None) -> None:
        super().__init__(config, context)
        self.served_by: dict[str, str] = {}  # pending record id -> the release that served it
        self.newest: tuple[str, float] | None = None  # (canary release id, made at) of the last candidate

    def intake(self, items: Sequence[ReportedRecords], view: LearnerView) -> None:
        for item in items:
            for record in item.records:
                if record.release is not None:
                    self.served_by[record.id] = record.release.release_id
        super().intake(items, view)

    async def next_batch(self, view: LearnerView) -> SAOBatch | None:
        if (
            self.config.fresh
            and self.newest is not None
            and time.monotonic() - self.newest[1] < self.config.fresh_max_wait
        ):
            fresh = [s for s in self.pending if self.served_by.get(s.record_id) == self.newest[0]]
            if len(fresh) < min(self.config.fresh, self.candidate_size):
                return None
            # the newest candidate's samples last: the batch is the newest `candidate_size` of pending
            ids = {s.record_id for s in fresh}
            self.pending = [s for s in self.pending if s.record_id not in ids] + fresh
        batch = await super().next_batch(view)
        if batch is not None:
            self.served_by.clear()  # nothing is pending after a batch
        return batch

    async def candidate(self, batch: SAOBatch, job: Job) -> Made:
        made = await super().candidate(batch, job)
        folder = Path(self.config.line_dir)
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{time.time():.3f}.part"
        partial.write_bytes(made.files[ADAPTER_WEIGHTS])
        partial.rename(partial.with_suffix(".safetensors"))
        self.newest = (canary_release_id(job.batch_id), time.monotonic())
        return made
