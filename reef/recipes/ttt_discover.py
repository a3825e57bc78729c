"""TTT-Discover: learning at test time from a search harness's groups of scored rollouts.

A search harness (TTT-Discover's PUCT search, or any best-of-n loop) samples `group_size`
rollouts of one problem at each search step and reports a score for each, naming where the
rollout sits: `step`, `group`, `rollout` (0 to `group_size` - 1) and `group_size`, in the
report's `metadata` or as the record's tags (`x-reef-tag-step`, ...). Reports may come in any
order; a group waits until every rollout is reported (the first report at a slot wins). A
complete group is trained only if all its rollouts came from one release, and that release is
at most `max_staleness` publications old; otherwise it is refused: logged as a batch and
abandoned with the reason, so its records are never trained on.

Advantages are leave-one-out within the group: a rollout's score minus the mean of its
siblings'. With `advantage: entropic`, the adaptive entropic variant: weights exp(beta * score)
with beta chosen so that their distribution is ENTROPIC_KL (ln 2) nats from uniform, and advantage =
a rollout's weight over its siblings' mean weight, minus 1 (the best rollouts count far more
than the rest, as a search that wants the maximum needs). The loss is `importance_sampling`
(on-policy, no clipping) with a KL penalty to the base model. `groups_per_batch` complete groups
make a candidate after `steps_per_candidate` optimiser steps. A hash-chosen fraction of groups
is held out of training for the gate's offline check.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, Sequence

from pydantic import Field

from reef.config.training import WeightsTrainingConfig
from reef.core.errors import NotFound
from reef.core.training import Datum, LossConfig
from reef.core.types import JSON, Record, Report, ReportedRecords
from reef.grow.recipe import (
    Abandon,
    Job,
    LearnerView,
    Made,
    RecipeContext,
    held_out,
    missing_records,
    offline_holdout_fraction,
)
from reef.grow.rollouts import ScoredRollout, rollout_of, rollout_problem, staleness_problem

NAME = "ttt_discover"
COORDINATES = ("step", "group", "rollout", "group_size")
ENTROPIC_KL = math.log(2)  # nats of the entropic advantage's weights from uniform (the paper's)
MAX_OPEN_GROUPS = 256  # incomplete groups kept waiting; the oldest go first


class TTTDiscoverConfig(WeightsTrainingConfig):
    """Knobs of the `ttt_discover` recipe: `learner.ttt_discover` (docs/learning.md); the LoRA
    shape and optimiser are every weights recipe's (reef/config/training.py)."""

    group_size: int = Field(8, ge=2, description="Rollouts per group; a report naming another size is dropped")
    groups_per_batch: int = Field(1, ge=1, description="Complete groups per candidate")
    advantage: Literal["loo", "entropic"] = Field("loo", description="loo: score minus the siblings' mean")
    kl_coef: float = Field(0.05, ge=0, description="Weight of the KL penalty to the base model")


@dataclass
class Group:
    step: int
    group: int
    rollouts: dict[int, ScoredRollout] = field(default_factory=dict)  # by slot

    @property
    def name(self) -> str:
        return f"step {self.step} group {self.group}"

    def ordered(self) -> list[ScoredRollout]:
        return [self.rollouts[i] for i in sorted(self.rollouts)]


@dataclass(frozen=True)
class GroupBatch:
    groups: list[Group]
    refusal: tuple[str, str] | None = None  # (kind, reason): logged as the batch's abandonment

    @property
    def record_ids(self) -> list[str]:
        return [r.record_id for g in self.groups for r in g.ordered()]

    @property
    def report_ids(self) -> list[str]:
        return sorted({r.report_id for g in self.groups for r in g.ordered()})


class TTTDiscoverRecipe:
    name = NAME
    surface = "weights"
    harness_gate = None  # judged by the weights gate (learner.gate)
    Settings = TTTDiscoverConfig

    def __init__(self, config: TTTDiscoverConfig, context: RecipeContext | None = None) -> None:
        self.config = config
        self.holdout_fraction = offline_holdout_fraction(context)
        self.groups: dict[tuple[int, int], Group] = {}  # waiting, in the order first seen
        self.holdout: deque[ScoredRollout] = deque(maxlen=64)

    # -- eligibility ----------------------------------------------------------------------------

    def intake(self, items: Sequence[ReportedRecords], view: LearnerView) -> None:
        for item in items:
            if missing_records(item):
                view.drop("compacted_or_missing", missing_records(item))
            for record in item.records:
                problem = rollout_problem(record, view.consumed)
                at = coordinate(item.report, record) if problem is None else None
                if problem is None and at is None:
                    problem = "no_group"
                elif at is not None and (at[3] != self.config.group_size or not 0 <= at[2] < at[3]):
                    problem = "bad_group"
                if problem is not None:
                    view.drop(problem)
                    continue
                assert at is not None
                self._place(
                    ScoredRollout(item.report.id, item.cursor, float(item.report.score), rollout_of(record)), at, view
                )
        self._expire(view)

    def _place(self, rollout: ScoredRollout, at: tuple[int, int, int, int], view: LearnerView) -> None:
        step, group, index, _ = at
        if held_out(f"{step}/{group}", self.holdout_fraction, "group:"):
            self.holdout.append(rollout)
            return
        waiting = self.groups.setdefault((step, group), Group(step, group))
        if index in waiting.rollouts:
            view.drop("duplicate_rollout")
            return
        waiting.rollouts[index] = rollout

    def _expire(self, view: LearnerView) -> None:
        while len(self.groups) > MAX_OPEN_GROUPS:
            oldest = next(iter(self.groups))
            view.drop("incomplete_group_expired", len(self.groups.pop(oldest).rollouts))

    # -- batches ------------------------------------------------------------------------------

    async def next_batch(self, view: LearnerView) -> GroupBatch | None:
        complete = sorted(key for key, g in self.groups.items() if len(g.rollouts) == self.config.group_size)
        for key in complete:  # a refused group is its own batch, abandoned with the reason
            refusal = self._refusal(self.groups[key], view)
            if refusal is not None:
                return GroupBatch([self.groups.pop(key)], refusal)
        if len(complete) < self.config.groups_per_batch:
            return None
        return GroupBatch([self.groups.pop(key) for key in complete[: self.config.groups_per_batch]])

    def _refusal(self, group: Group, view: LearnerView) -> tuple[str, str] | None:
        releases = sorted({r.rollout.release_id for r in group.rollouts.values()})
        if len(releases) > 1:
            return "mixed_releases", f"{group.name} spans {len(releases)} releases ({', '.join(releases)})"
        problem = staleness_problem(releases[0], view, self.config.max_staleness)
        why = {
            "stale": f"more than {self.config.max_staleness} publications old",
            "unknown_release": "unknown to the chain",
        }
        return None if problem is None else (problem, f"{group.name} came from release {releases[0]}, {why[problem]}")

    def resume(self, items: Sequence[ReportedRecords]) -> GroupBatch:
        groups: dict[tuple[int, int], Group] = {}
        for item in items:
            record = item.records[0]
            at = coordinate(item.report, record)
            if at is None or record.release is None:
                raise NotFound(f"record {record.id} names no group")
            groups.setdefault(at[:2], Group(*at[:2])).rollouts[at[2]] = ScoredRollout(
                item.report.id, item.cursor, float(item.report.score), rollout_of(record)
            )
        return GroupBatch([groups[key] for key in sorted(groups)])

    def high_water(self, cursor: int) -> int:
        seqs = [r.report_seq for g in self.groups.values() for r in g.rollouts.values()]
        return min(seqs) - 1 if seqs else cursor

    # -- the candidate --------------------------------------------------------------------------

    async def candidate(self, batch: GroupBatch, job: Job) -> Made:
        refusal = batch.refusal or next(
            (
                ("mixed_releases", f"{g.name} spans several releases")
                for g in batch.groups
                if len({r.rollout.release_id for r in g.rollouts.values()}) > 1
            ),
            None,
        )
        if refusal is not None:
            raise Abandon(*refusal)
        data = [datum for g in batch.groups for datum in self._data(g)]
        if not any(a for d in data for a in d.advantages):
            raise Abandon("no_signal", "every rollout of its groups scored the same: nothing to learn")
        assert job.trainer is not None
        c = self.config
        await job.trainer.load_state(job.start, c.lora)
        metrics: dict[str, float] = {}
        for _ in range(c.steps_per_candidate):
            metrics = await job.trainer.forward_backward(data, "importance_sampling", LossConfig(kl_coef=c.kl_coef))
            metrics.update(await job.trainer.optim_step(c.adam))
        state = job.algorithm_state
        state["groups_trained"] = int(state.get("groups_trained", 0)) + len(batch.groups)
        state["last_step"] = max(g.step for g in batch.groups)
        return Made(
            await job.trainer.save_state(),
            metrics={"training": metrics, "groups": [g.name for g in batch.groups]},
            held_out=[(r.score, r.rollout) for r in self.holdout],
        )

    def _data(self, group: Group) -> list[Datum]:
        rollouts = group.ordered()
        scores = [r.score for r in rollouts]
        advantages = (
            entropic_advantages(scores, ENTROPIC_KL) if self.config.advantage == "entropic" else leave_one_out(scores)
        )
        return [r.rollout.datum(a) for r, a in zip(rollouts, advantages)]

    def status(self) -> JSON:
        return {"open_groups": len(self.groups), "held_out": len(self.holdout)}

    async def close(self) -> None:
        return None


def coordinate(report: Report, record: Record) -> tuple[int, int, int, int] | None:
    """(step, group, rollout, group_size) from the report's metadata, else the record's tags."""
    source = report.metadata if all(k in report.metadata for k in COORDINATES) else record.tags
    try:
        values = tuple(int(source[k]) for k in COORDINATES)
    except (KeyError, TypeError, ValueError):
        return None
    return values if min(values) >= 0 else None  # type: ignore[return-value]


def leave_one_out(scores: list[float]) -> list[float]:
    """Each score minus the mean of the others'."""
    n, total = len(scores), sum(scores)
    return [s - (total - s) / (n - 1) for s in scores]


def entropic_advantages(scores: list[float], kl: float) -> list[float]:
    """Leave-one-out entropic advantages: w_i / mean_{j != i} w_j - 1 with w = exp(beta * score),
    beta set so that KL(softmax(beta * scores) || uniform) = `kl` (as far as the scores allow)."""
    beta = _beta_for(scores, kl)
    top = max(scores)
    weights = [math.exp(beta * (s - top)) for s in scores]  # shifting every score leaves the ratios alone
    n, total = len(weights), sum(weights)
    return [w / ((total - w) / (n - 1)) - 1 for w in weights]


def _beta_for(scores: list[float], kl: float, cap: float = 1e4) -> float:
    def divergence(beta: float) -> float:
        top = max(scores)
        weights = [math.exp(beta * (s - top)) for s in scores]
        total = sum(weights)
        return sum(w / total * math.log(w / total * len(scores)) for w in weights if w > 0)

    high = 1.0
    while divergence(high) < kl and high < cap:
        high *= 2
    if divergence(high) < kl:
        return min(high, cap)  # the scores cannot spread that far (e.g. all equal): the sharpest there is
    low = 0.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if divergence(mid) < kl else (low, mid)
    return (low + high) / 2
