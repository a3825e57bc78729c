"""A sabotaged client for the race (bench/learning_race.py `--flip-scores`): it reports every
score flipped (1 - the task's score: a right answer 0, a wrong one 1), so training and the live
scores of the line and the serving release all push away from the task, while the gate's tasks
are still scored by the real verifier. The race's test then shows whether a release the flipped
scores favoured was ever published (the head must stay at the base).
"""

from __future__ import annotations

from typing import Any


class FlippedScores:
    """A task module whose `score` (what the race's clients report) is flipped; the rest is the
    wrapped module's (the gate's scorer is named separately and stays the real one)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    def score(self, task: dict[str, Any], text: str, finish_reason: str = "stop") -> float:
        return 1.0 - float(self.module.score(task, text, finish_reason))
