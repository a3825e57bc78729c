"""The one-sided sign test, shared by the gate (is a candidate better?) and the learner (is a
line of candidates worse?)."""

from __future__ import annotations

import math


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided: the chance of at least `wins` wins in `wins + losses` fair coin flips."""
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n
