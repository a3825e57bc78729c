"""bench/gate_size.py: the gate's own rule, simulated, sees a gain more often with more tasks, and
selects a candidate that is no better no more often than its confidence allows."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import gate_size  # noqa: E402


def test_more_tasks_see_a_small_gain_more_often() -> None:
    few = gate_size.power(23, 0.10, 6.0, trials=300)
    many = gate_size.power(368, 0.10, 6.0, trials=300)
    assert many["selected"] > few["selected"] + 0.5
    assert many["tasks_asked"] < 368  # the sequential test stopped some verdicts early


def test_a_candidate_no_better_is_selected_at_most_at_the_gates_level() -> None:
    for n in (23, 92, 368):
        assert gate_size.power(n, 0.30, 0.0, trials=600)["selected"] <= 0.2 + 0.05
