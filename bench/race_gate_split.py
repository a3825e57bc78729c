"""A race task with more gate tasks: bench/learning_race.py's `--gate-from-train N`.

The gate's sign test on the demo's 92 held-out questions cannot see a gain of a few points near
the ceiling (docs/learning.md, "The line the learner trains, beside the head"). This gives Reef's
gate also one in N of the training questions (chosen by a hash of the question, the same in every
run), which Reef's traffic then never asks. The test questions are unchanged, and the bare loop
still trains on every training question: the split costs Reef training questions, never the
bare loop.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def moved_to_gate(question: str, every: int) -> bool:
    return every > 0 and int(hashlib.sha256(f"gate:{question}".encode()).hexdigest(), 16) % every == 0


class WiderGate:
    """A task module (train_tasks, heldout_tasks, ...) with one in `every` training questions moved
    to the gate's tasks; everything else is the wrapped module's."""

    def __init__(self, module: Any, every: int) -> None:
        self.module, self.every = module, every

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    def train_tasks(self) -> list[dict[str, Any]]:
        return [t for t in self.module.train_tasks() if not moved_to_gate(t["question"], self.every)]

    def heldout_tasks(self) -> list[dict[str, Any]]:
        moved = [t for t in self.module.train_tasks() if moved_to_gate(t["question"], self.every)]
        return [*self.module.heldout_tasks(), *moved]

    def write_heldout_jsonl(self, path: Path, examples: int | None = None) -> Path:
        examples = self.module.SHOWN_EXAMPLES if examples is None else examples
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = (self.module.heldout_record(t, examples) for t in self.heldout_tasks())
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path
