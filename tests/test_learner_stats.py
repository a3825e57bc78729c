"""How a learner reads the gate's rejections of one line of training."""

from __future__ import annotations

import pytest

from reef.core.types import Verdict
from reef.grow.learner_stats import LineageEvidence, SampleWait, promising


def verdict(**outcomes: tuple[float, float]) -> Verdict:
    """A tasks-gate rejection with these per-task (current, candidate) scores, keyed by index."""
    per_task = [{"index": int(k[1:]), "current": c, "candidate": a} for k, (c, a) in outcomes.items()]
    wins = sum(a > c for c, a in outcomes.values())
    losses = sum(a < c for c, a in outcomes.values())
    return Verdict("reject", {"gate": "tasks", "wins": wins, "losses": losses, "per_task": per_task})


def test_a_task_lost_by_every_candidate_of_a_line_counts_once() -> None:
    evidence = LineageEvidence()
    for _ in range(6):  # each candidate loses the one task the serving release gets right
        evidence.add(verdict(t7=(1.0, 0.0), t3=(0.0, 0.0), t9=(0.0, 0.0)))
    assert (evidence.wins, evidence.losses, evidence.verdicts) == (0, 1, 6)
    assert not evidence.surely_worse()  # summing per verdict would say 0-6: p = 0.016


def test_losses_on_different_tasks_add_up_and_the_newest_outcome_counts() -> None:
    evidence = LineageEvidence()
    evidence.add(verdict(t1=(1.0, 0.0), t2=(1.0, 0.0), t3=(0.0, 1.0)))
    assert not evidence.surely_worse()  # one verdict is the gate's own business
    evidence.add(verdict(t3=(0.0, 0.0), t4=(1.0, 0.0), t5=(1.0, 0.0), t6=(1.0, 0.0)))
    assert (evidence.wins, evidence.losses) == (0, 5)  # t3's win was undone by the newer candidate
    assert evidence.surely_worse()  # 0-5 over five tasks: p = 0.031


def test_verdicts_without_task_indices_add_their_counts() -> None:
    evidence = LineageEvidence()
    for _ in range(3):
        evidence.add(Verdict("reject", {"gate": "offline", "wins": 0, "losses": 2}))
    assert (evidence.wins, evidence.losses) == (0, 6) and evidence.surely_worse()
    harness = {
        "gate": "harness",
        "wins": 1,
        "losses": 0,  # per-task results keyed by an excerpt of the task
        "per_task": [{"task": "What is 2 + 2?", "current": 0.0, "candidate": 1.0}],
    }
    assert (evidence.add(Verdict("reject", harness)).wins, evidence.losses) == (1, 6)


def test_a_rejection_is_worth_training_on_unless_the_gate_is_sure_it_is_worse() -> None:
    assert promising(Verdict("reject", {"p_worse": 0.25}))
    assert not promising(Verdict("reject", {"p_worse": 0.03}))
    assert promising(Verdict("reject", {"wins": 2, "losses": 1}))  # no paired test: won more than it lost
    assert not promising(Verdict("reject", {"wins": 1, "losses": 1}))


def test_sample_wait_says_when_the_learner_waits_for_traffic() -> None:
    wait = SampleWait(decay=0.5)
    wait.made(0.0, 4.0)  # the first candidate: no wait before it is counted
    assert wait.fraction is None and not wait.starved()
    wait.made(4.0, 8.0)  # the next batch was ready at once
    assert wait.fraction == 0.0 and not wait.starved()
    wait.made(14.0, 18.0)  # waited 6 s for samples, made it in 4
    assert wait.fraction == pytest.approx(0.5 * 0.6) and wait.starved()
    wait.made(18.0, 22.0)
    assert wait.fraction == pytest.approx(0.15) and not wait.starved()  # starved: a fifth of its time or more


def test_the_first_wait_counts_until_the_first_candidate() -> None:
    wait = SampleWait(idle_since=100.0)
    assert wait.first_wait(112.5) == 12.5  # no candidate yet: waiting since the start
    wait.made(112.5, 116.0)
    assert wait.first_wait(130.0) is None  # one made: the first wait is over
    assert SampleWait().first_wait(5.0) is None  # not counted
