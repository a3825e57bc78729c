"""Live scores as evidence, plain data: a line of weights candidates served side by side with the
serving release (an A/B split of live traffic), and the tests shared by the learner (is a canary
worse?) and the gate (does the line, with the candidate's own tasks, beat the serving release?).

Two scores from the same traffic at the same time are compared with a one-sided two-sample z-test
on the pooled variance (scores are skewed: a few scores of a good canary are often all 0, and a
test on each side's own variance would then decide on the other side's spread alone). The gate
combines that z with its sign test's (normal approximation with continuity correction) by
Stouffer's sum, equal weights: one test at one level, so adding live evidence adds no chance of
selecting a candidate when neither it (its tasks) nor its line (the live scores) is better. The
live scores are of the line's recent canaries, not of the candidate alone; a candidate that broke
what its line had shows it on its own tasks. And live scores are the client's: a client whose
scores are wrong (flipped by a bug, or lying for the canary) can make their z as large as it
likes, so the tasks must bring at least half the evidence themselves (`tasks_share_p`: their own
p at most the square root of the level, half of its log); live scores bring the rest, and can
never carry a candidate its tasks show level with the serving release or behind it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Sequence

Z_CAP = 8.0  # beyond any level a gate asks; keeps verdict metrics finite (JSON)


@dataclass(frozen=True)
class ScoreSummary:
    n: int
    mean: float
    var: float  # the sample variance (n - 1)

    @classmethod
    def of(cls, scores: Sequence[float]) -> ScoreSummary:
        n = len(scores)
        if n == 0:
            return cls(0, 0.0, 0.0)
        mean = sum(scores) / n
        return cls(n, mean, sum((s - mean) ** 2 for s in scores) / max(1, n - 1))


@dataclass(frozen=True)
class LiveEvidence:
    """The line's live scores since the split began, and the serving release's over the same time."""

    line: ScoreSummary
    serving: ScoreSummary
    serving_release_id: str

    def z(self) -> float:
        return two_sample_z(self.line, self.serving)

    def to_json(self) -> dict[str, Any]:
        return {
            "line_n": self.line.n,
            "line_mean": self.line.mean,
            "serving_n": self.serving.n,
            "serving_mean": self.serving.mean,
            "z": self.z(),
        }


def two_sample_z(a: ScoreSummary, b: ScoreSummary) -> float:
    """How many standard errors a's mean is above b's (pooled variance); 0 when either has under 2."""
    if a.n < 2 or b.n < 2:
        return 0.0
    pooled = ((a.n - 1) * a.var + (b.n - 1) * b.var) / (a.n + b.n - 2)
    se = math.sqrt(pooled * (1 / a.n + 1 / b.n))
    if se == 0:
        return 0.0 if a.mean == b.mean else math.copysign(Z_CAP, a.mean - b.mean)
    return max(-Z_CAP, min(Z_CAP, (a.mean - b.mean) / se))


def sign_test_z(wins: int, losses: int) -> float:
    """The one-sided sign test as a z (normal approximation, continuity corrected): P(at least
    `wins`) is about 1 - Phi(z). 0 with no wins and no losses."""
    n = wins + losses
    return (wins - losses - 1) / math.sqrt(n) if n else 0.0


def combined_p(wins: int, losses: int, live: LiveEvidence) -> float:
    """One-sided p of the tasks' sign test and the live scores together (Stouffer, equal weights)."""
    z = (sign_test_z(wins, losses) + live.z()) / math.sqrt(2)
    return 1 - NormalDist().cdf(z)


def tasks_share_p(level: float) -> float:
    """The largest p the tasks' own sign test may have for live scores to join it: the square root
    of the level (at 0.2, 0.45: a 2-0 or a 3-1 can be carried, a 1-0 or a 4-3 cannot)."""
    return math.sqrt(level)
