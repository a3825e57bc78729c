"""The SAO recipe, as bench/learning_race.py's `--line` runs it: every candidate's adapter is
also written to `line_dir`, named by the wall-clock second it was made, so the race can measure
the line the learner trains (the newest candidate at each snapshot) beside the release the gate
let serve. Bound by its dotted path (`race_line:LineSAO`), like any recipe of a user's own."""

from __future__ import annotations

import time
from pathlib import Path

from reef.core.training import ADAPTER_WEIGHTS
from reef.grow.recipe import Job, Made
from reef.recipes.sao import SAOBatch, SAOConfig, SAORecipe


class LineConfig(SAOConfig):
    line_dir: str


class LineSAO(SAORecipe):
    Settings = LineConfig

    async def candidate(self, batch: SAOBatch, job: Job) -> Made:
        made = await super().candidate(batch, job)
        folder = Path(self.config.line_dir)  # type: ignore[attr-defined]
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{time.time():.3f}.part"
        partial.write_bytes(made.files[ADAPTER_WEIGHTS])
        partial.rename(partial.with_suffix(".safetensors"))
        return made
