"""The seam between the learner loop and a method of learning: the `Recipe` protocol.

A recipe is one class, usually one file, that owns:
- `name`, `surface` ("weights": a LoRA adapter trained through the primitives; "harness": a
  tree of prompts, rules and skills changed by a proposer) and `Settings`, the pydantic model
  of its config section `learner.<name>`; a harness recipe also `harness_gate`, the settings
  its candidates are judged by (a `HarnessGateConfig`, usually a part of its own settings);
- eligibility: `intake(items, view)` keeps what it can learn from and counts everything else
  by drop reason (`view.drop`);
- batch forming: `next_batch(view)` returns a `Batch` once one is ready, else None; `resume`
  rebuilds a logged batch from its records after a restart;
- the candidate: `candidate(batch, job)` trains (`job.trainer`: `reef.grow.training_client`)
  or proposes, and returns a `Made`, or raises `Abandon` with a reason for the log.
The learner (`reef.grow.learner`) does the rest, the same for every recipe: the report cursor,
the batch log, handing candidates to the gate, recovery and status. Recipes are found by name or
dotted path (`reef.config.find_recipe`). docs/recipes.md walks through SAO as the example.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, ClassVar, Mapping, Protocol, Sequence

from pydantic import BaseModel

from reef.config import GateConfig, HarnessGateConfig
from reef.core.learned import LearnedCandidate
from reef.core.types import JSON, Release, ReleaseRef, ReportedRecords
from reef.grow.training_client import TrainingClient
from reef.observe.store import ExperienceStore
from reef.runtimes.base import Runtime

SURFACES = ("weights", "harness")


class Batch(Protocol):
    """What a recipe took for one candidate; the learner logs its ids before any work."""

    @property
    def record_ids(self) -> list[str]: ...

    @property
    def report_ids(self) -> list[str]: ...


class Abandon(Exception):
    """The batch gives no candidate (a proposer's invalid output, nothing to change): the
    learner closes it as abandoned with `kind: reason` in the log, and learning goes on."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class RecipeContext:
    """What a recipe may use beyond its own settings."""

    runtime: Runtime  # the scenario's runtime (a proposer or judge may call it)
    gate: GateConfig  # the weights gate's settings (with tasks, every record may train)


def offline_holdout_fraction(context: RecipeContext | None) -> float:
    """The fraction of records a weights recipe keeps out of training for the gate's offline check:
    none when the gate has evaluation tasks (then every record trains)."""
    gate = context.gate if context is not None else None
    return gate.holdout_fraction if gate is not None and not gate.tasks else 0.0


@dataclass
class LearnerView:
    """What a recipe sees of its scenario while it takes in reports and forms batches."""

    scenario: str
    consumed: set[str]  # records a logged batch already named: never learned from twice
    staleness_of: Callable[[str], int | None]  # releases published after a release (None: unknown to the chain)
    head: Callable[[], Release]
    head_files: Callable[[], Awaitable[dict[str, bytes]]]
    dropped: Counter[str] = field(default_factory=Counter)
    store: ExperienceStore | None = None  # the scenario's records, for a recipe that learns from traffic
    # itself rather than from reports (openclaw_rl stitches sessions from it); read-only but for
    # `stitch_session`, which names a record's session in the store, never its content
    # the training mode lets traffic make a batch now (auto, hybrid, or a train-now request); when
    # False, a recipe that takes instructions (`instruct`) is still asked, for those alone
    from_traffic: bool = True

    def drop(self, reason: str, n: int = 1) -> None:
        if n:  # a reason is shown only once something was dropped for it
            self.dropped[reason] += n


@dataclass
class Job:
    """One batch being made into a candidate."""

    scenario: str
    batch_id: str
    start: dict[str, bytes] | None  # weights: the checkpoint to train on from (the last candidate's, or the head's)
    head: Release  # the head now: a harness candidate is made from and judged against it
    head_files: dict[str, bytes]
    serving: ReleaseRef  # what serves now (a proposer may ask the scenario's own runtime)
    trainer: TrainingClient | None  # the training primitives (weights surface only)
    algorithm_state: JSON  # the recipe's state so far; update it as the batch is used

    def candidate(
        self, made: Made, recipe: str, high_water: int, gate_overrides: Mapping[str, Any]
    ) -> LearnedCandidate:
        """What the gate is handed of `made`: where it came from, the recipe's state, and the
        training steps the job took (the dashboard's training curve)."""
        steps = self.trainer.take_steps() if self.trainer is not None else []
        return LearnedCandidate(
            self.scenario,
            self.batch_id,
            recipe,
            made.files,
            self.head.release_id,
            self.head_files,
            high_water,
            made.metadata,
            {**made.metrics, "steps": steps} if steps else made.metrics,
            {**self.algorithm_state, "recipe": recipe},
            made.held_out,
            gate_overrides=dict(gate_overrides),
        )


@dataclass
class Made:
    files: dict[str, bytes]
    metadata: JSON = field(default_factory=dict)
    metrics: JSON = field(default_factory=dict)
    held_out: list[Any] = field(default_factory=list)


class Recipe(Protocol):
    name: ClassVar[str]
    surface: ClassVar[str]
    Settings: ClassVar[type[BaseModel]]
    # surface "harness" only: how the harness gate judges its candidates (reef.commit.harness_gate);
    # a weights recipe's candidates go to the weights gate (`learner.gate`, `context.gate`)
    harness_gate: HarnessGateConfig | None

    def __init__(self, settings: Any, context: RecipeContext) -> None: ...

    def intake(self, items: Sequence[ReportedRecords], view: LearnerView) -> None:
        """Take in newly reported records: keep what can be learned from, `view.drop` the rest."""

    async def next_batch(self, view: LearnerView) -> Batch | None:
        """The batch to make a candidate from now, taken out of what waits; None to wait."""

    def resume(self, items: Sequence[ReportedRecords]) -> Batch:
        """A logged batch again, from its records (each with its latest report), after a restart."""

    def high_water(self, cursor: int) -> int:
        """The report cursor a new batch is logged at: below every report still waiting here."""

    async def candidate(self, batch: Batch, job: Job) -> Made:
        """The batch made into a candidate; `Abandon` when it gives none."""

    def status(self) -> JSON:
        """The recipe's own numbers for the learner status (waiting items, last timings)."""

    async def close(self) -> None:
        """Release what the recipe holds (a model's connection pool)."""


def held_out(record_id: str, fraction: float, salt: str = "") -> bool:
    """A fixed, hash-chosen `fraction` of records, kept out of training for the gate."""
    digest = hashlib.sha256((salt + record_id).encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def missing_records(item: ReportedRecords) -> int:
    """References of a report whose records are gone (compacted) or never came."""
    return len(item.report.references) - len(item.records)
