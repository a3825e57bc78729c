"""What a learner counts for its status, and how it reads a rejection."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from reef.core.sign_test import sign_test_p
from reef.core.types import Verdict

WORSE_P = 0.05  # a rejected candidate is trained on unless the gate is this sure it is worse
STARVED_FRACTION = 0.2  # the learner waits for samples this share of its time or more: traffic is what it lacks


@dataclass
class LearnerStats:
    state: str = "starting"
    batches: int = 0
    candidates: int = 0
    published: int = 0
    review: int = 0
    rejected: int = 0
    abandoned: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    last_verdict: dict[str, Any] | None = None
    last_error: str | None = None

    def count(self, verdict: Verdict) -> None:
        self.last_verdict = {
            "decision": verdict.decision,
            **{k: v for k, v in verdict.metrics.items() if k != "per_task"},
        }
        if verdict.decision == "select":
            self.published += 1
        elif verdict.decision == "review":
            self.review += 1
        else:
            self.rejected += 1


def promising(verdict: Verdict) -> bool:
    """A rejected candidate worth training on from: one the gate could not show to be worse than
    the serving release (`p_worse` above WORSE_P: a few more losses than wins on a small task
    set is noise, and throwing the candidate away would throw away every step it took). A
    candidate the gate is sure is worse is dropped, so a drift away from the task is not built on.
    Without the paired test (the offline check), only one that won more than it lost."""
    p_worse = verdict.metrics.get("p_worse")
    if p_worse is not None:
        return float(p_worse) > WORSE_P
    return int(verdict.metrics.get("wins", 0)) > int(verdict.metrics.get("losses", 0))


def behind_on_tasks(verdict: Verdict) -> bool:
    """Whether the candidate lost more of the gate's tasks than it won. Live scores never carry
    such a candidate (its tasks' own p is above any look's limit), so its undecided verdict does
    not start the split, which would serve that line to the split's share of the traffic."""
    return int(verdict.metrics.get("losses", 0)) > int(verdict.metrics.get("wins", 0))


@dataclass
class LineageEvidence:
    """The gate's wins and losses over the rejected candidates of one line of training, each
    trained on from the one before: one candidate's evidence is thin (a sequential gate stops
    early on few decided tasks), theirs together says whether the line is going the wrong way.
    Candidates meet the gate's tasks in different orders and may stop at different looks, so a
    task counts once, by the newest outcome on it: five candidates that each lose the one
    task the serving release gets right are one loss, not five (the sign test is over tasks).
    A verdict without task indices (the offline check, the harness gate) adds its counts as they are."""

    outcomes: dict[int, int] = field(default_factory=dict)  # task index -> +1 won, -1 lost, 0 tied (newest)
    counted_wins: int = 0  # from verdicts without task indices
    counted_losses: int = 0
    verdicts: int = 0

    def add(self, verdict: Verdict) -> LineageEvidence:
        per_task = verdict.metrics.get("per_task") or []
        if per_task and all("index" in t for t in per_task):
            for t in per_task:
                diff = float(t["candidate"]) - float(t["current"])
                self.outcomes[int(t["index"])] = (diff > 0) - (diff < 0)
        else:
            self.counted_wins += int(verdict.metrics.get("wins", 0))
            self.counted_losses += int(verdict.metrics.get("losses", 0))
        self.verdicts += 1
        return self

    @property
    def wins(self) -> int:
        return self.counted_wins + sum(o > 0 for o in self.outcomes.values())

    @property
    def losses(self) -> int:
        return self.counted_losses + sum(o < 0 for o in self.outcomes.values())

    def surely_worse(self) -> bool:
        return self.verdicts > 1 and sign_test_p(self.losses, self.wins) <= WORSE_P


@dataclass
class SampleWait:
    """How much of the learner's time goes to waiting for samples rather than making candidates:
    per batch, the wait since the last candidate was made over the wait plus the making, as a
    running average (`decay` per batch). Near 1: the trainer waits for traffic (live traffic is
    what learning lacks); near 0: batches are ready as soon as the trainer is."""

    decay: float = 0.7
    fraction: float | None = None
    idle_since: float | None = None  # when the last candidate was made, or waiting began (None: not counted)
    making: float | None = None  # how long the last candidate took to make

    def made(self, started: float, ended: float) -> None:
        """A candidate was made from `started` to `ended` (monotonic seconds)."""
        if self.idle_since is not None:
            waited = max(0.0, started - self.idle_since)
            share = waited / max(1e-9, waited + (ended - started))
            self.fraction = share if self.fraction is None else self.decay * self.fraction + (1 - self.decay) * share
        self.idle_since, self.making = ended, ended - started

    def longer_than_making(self, now: float) -> bool:
        """Whether the learner has now waited for samples longer than its last candidate took to make."""
        return self.idle_since is not None and self.making is not None and now - self.idle_since > self.making

    def first_wait(self, now: float) -> float | None:
        """How long the learner has waited for the samples of its first candidate (None: it has made one)."""
        return now - self.idle_since if self.making is None and self.idle_since is not None else None

    def starved(self, threshold: float = STARVED_FRACTION) -> bool:
        return self.fraction is not None and self.fraction >= threshold
