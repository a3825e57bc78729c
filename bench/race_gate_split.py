"""Race tasks split differently between Reef's traffic and its gate (bench/learning_race.py).

`--gate-from-train N` (WiderGate): the gate's sign test on the demo's 92 held-out questions cannot
see a gain of a few points near the ceiling, so the gate also takes one in N of the training
questions, which Reef's traffic then never asks.

`--gate-half` (HalfGate): the gate judges on one half of the held-out questions; the other half
(`unjudged_tasks`) nothing asks, trains or selects on, so an evaluation on both halves can tell
after the run whether the head the gate chose is better on the half that chose it than on the other
(the winner's curse of one held-out set reused by every verdict).

Questions are chosen by a hash of the question (the same in every run). The test questions are
unchanged, and the bare loop still trains on every training question: a split costs Reef
training questions, never the bare loop.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def _bucket(salt: str, question: str, every: int) -> bool:
    return every > 0 and int(hashlib.sha256(f"{salt}:{question}".encode()).hexdigest(), 16) % every == 0


class SplitTasks:
    """A task module (train_tasks, heldout_tasks, ...) whose split subclasses change; everything
    else is the wrapped module's."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    def train_tasks(self) -> list[dict[str, Any]]:
        return self.module.train_tasks()

    def heldout_tasks(self) -> list[dict[str, Any]]:
        return self.module.heldout_tasks()

    def write_heldout_jsonl(self, path: Path, examples: int | None = None) -> Path:
        examples = self.module.SHOWN_EXAMPLES if examples is None else examples
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = (self.module.heldout_record(t, examples) for t in self.heldout_tasks())
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path


class WiderGate(SplitTasks):
    """One in `every` training questions moved to the gate's tasks."""

    def __init__(self, module: Any, every: int) -> None:
        super().__init__(module)
        self.every = every

    def train_tasks(self) -> list[dict[str, Any]]:
        return [t for t in self.module.train_tasks() if not _bucket("gate", t["question"], self.every)]

    def heldout_tasks(self) -> list[dict[str, Any]]:
        moved = [t for t in self.module.train_tasks() if _bucket("gate", t["question"], self.every)]
        return [*self.module.heldout_tasks(), *moved]


class HalfGate(SplitTasks):
    """The gate judges on half the held-out questions; the other half is asked by no one."""

    def heldout_tasks(self) -> list[dict[str, Any]]:
        return [t for t in self.module.heldout_tasks() if _bucket("half", t["question"], 2)]

    def unjudged_tasks(self) -> list[dict[str, Any]]:
        return [t for t in self.module.heldout_tasks() if not _bucket("half", t["question"], 2)]
