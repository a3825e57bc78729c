"""Skills: the harness recipe. Reported records in, mutations of the harness tree out.

Each reported record becomes an observation: its score, the report's textual feedback, the
client's prompt and the answer. A score below `failure_below` is a failure. Failures wait in a
pending list (at most MAX_PENDING, the oldest dropped first) until the proposer says which of
them make a batch: the LLM proposer takes the `batch_size` lowest-scored failures once that many
wait; the model-free proposer takes the failures whose feedback forms a theme that recurs at
least `min_recurrence` times. A batch also carries the `successes` most recent successes, for
contrast. Without evaluation tasks in the gate's config, a fixed hash-chosen fraction of records
(`gate.holdout_fraction`) is never shown to the proposer and serves the gate as held-out tasks.

A record is used at most once: every record a logged batch named (published, rejected or
abandoned) is consumed for good.

An operator's instruction (`POST /reef/train`, `reef/grow/instructions.py`) is a batch of its
own, taken before any failure and in every training mode: its candidate adds one rule carrying
the instruction (`reef/recipes/instruction_rule.py`), judged by the gate like any other.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Protocol, Sequence

from pydantic import BaseModel, ConfigDict, Field

from reef.config import HarnessGateConfig, ModelEndpointConfig
from reef.core.errors import InvalidInput
from reef.core.types import JSON, Record, RecordStatus, ReportedRecords
from reef.grow.instructions import Instruction, instruction_in
from reef.grow.recipe import Abandon, Job, LearnerView, Made, RecipeContext, held_out, missing_records
from reef.recipes.instruction_rule import instruction_rule
from reef.surfaces.harness import HarnessTree, Mutation, merge_files
from reef.surfaces.inject import client_request

NAME = "skills"
FEEDBACK_KEYS = ("feedback", "message", "reason", "comment", "text", "note", "explanation")
SUCCESS_KEEP = 32
LAST_FAILURES = 5
HOLDOUT_SALT = "holdout:"
MAX_PENDING = 256  # failures waiting for a batch; the oldest go first
MAX_HOLDOUT = 32  # without tasks: the most recent held-out records the gate answers


class SkillsConfig(BaseModel):
    """Knobs of the `skills` recipe: `learner.skills` (docs/harness.md explains each)."""

    model_config = ConfigDict(extra="forbid")

    proposer: Literal["distill", "llm"] = Field("distill", description="distill: no model needed")
    failure_below: float = Field(0.5, description="A reported score below this is a failure")
    batch_size: int = Field(8, ge=1, description="Most failures in one batch (llm: failures needed for one)")
    successes: int = Field(2, ge=0, description="Successes added to a batch for contrast")
    min_recurrence: int = Field(3, ge=1, description="distill: failures with similar feedback before a rule")
    llm: ModelEndpointConfig = Field(default_factory=ModelEndpointConfig)
    gate: HarnessGateConfig = Field(default_factory=HarnessGateConfig)


@dataclass(frozen=True)
class Observation:
    """One reported record, as the harness recipe sees it."""

    record_id: str
    report_id: str
    report_seq: int
    score: float
    feedback: str
    prompt: str  # the client's conversation as text (what the proposer reads)
    response: str
    messages: tuple[dict[str, Any], ...]  # the client's messages, for held-out gate tasks

    def as_task(self) -> dict[str, Any]:
        """A held-out record as a gate task (a scorer sees the report too)."""
        return {
            "messages": [dict(m) for m in self.messages],
            "reported_score": self.score,
            "feedback": self.feedback,
            "record_id": self.record_id,
        }


@dataclass(frozen=True)
class Batch:
    failures: tuple[Observation, ...]
    successes: tuple[Observation, ...] = ()
    instruction: Instruction | None = None  # an operator's instruction: a batch of its own

    @property
    def record_ids(self) -> list[str]:
        own = [self.instruction.id] if self.instruction else []
        return own + [o.record_id for o in self.observations]

    @property
    def report_ids(self) -> list[str]:
        own = {self.instruction.report_id} if self.instruction else set()
        return sorted(own | {o.report_id for o in self.observations})

    @property
    def observations(self) -> tuple[Observation, ...]:
        return self.failures + self.successes


@dataclass(frozen=True)
class Proposal:
    mutations: tuple[Mutation, ...]
    notes: dict[str, Any] = field(default_factory=dict)  # what the proposer wants in the chain


class ProposalFailed(Abandon):
    """The proposer gave nothing usable; `kind: reason` goes into the log and the learner status."""


class Proposer(Protocol):
    name: str
    needs_feedback: bool

    def select(self, failures: Sequence[Observation], tree: HarnessTree) -> list[Observation]:
        """Which waiting failures make a batch now (empty: wait for more)."""

    async def propose(self, tree: HarnessTree, batch: Batch, serving: Any) -> Proposal:
        """Mutations of `tree` for this batch; `ProposalFailed` when there are none to give."""

    async def close(self) -> None:
        """Release what the proposer holds (a model's connection pool)."""


class SkillsRecipe:
    name = NAME
    surface = "harness"
    Settings = SkillsConfig

    @property
    def harness_gate(self) -> HarnessGateConfig:
        """The Recipe protocol's gate settings of a harness recipe: `learner.skills.gate`."""
        return self.config.gate

    def __init__(
        self, config: SkillsConfig, context: RecipeContext | None = None, proposer: Proposer | None = None
    ) -> None:
        self.config = config
        if proposer is None:
            from reef.recipes.proposers import build_proposer  # the proposers import this module

            assert context is not None, "a recipe context (its runtime) or a proposer"
            proposer = build_proposer(config, context.runtime)
        self.proposer = proposer
        # held-out records serve the gate only when it has no task file
        self.holdout_fraction = 0.0 if config.gate.tasks else config.gate.holdout_fraction
        self.failures: list[Observation] = []
        self.instructions: list[Instruction] = []  # taken before any failure, each a batch of its own
        self.successes: deque[Observation] = deque(maxlen=SUCCESS_KEEP)
        self.held_out: deque[Observation] = deque(maxlen=MAX_HOLDOUT)
        self.proposer_failures: Counter[str] = Counter()
        self.last_proposer_failures: deque[str] = deque(maxlen=LAST_FAILURES)
        self._tree: tuple[str, HarnessTree] | None = None

    # -- eligibility ----------------------------------------------------------------------------

    def intake(self, items: Iterable[ReportedRecords], view: LearnerView) -> None:
        """Sort newly reported records into failures, successes and held-out tasks, or count why not."""
        for item in items:
            if (instruction := instruction_in(item)) is not None:
                self.instruct(instruction, view)
                continue
            if missing_records(item):
                view.drop("compacted_or_missing", missing_records(item))
            feedback = feedback_text(item.report.feedback)
            for record in item.records:
                reason = self._ineligible(record, view.consumed, feedback, item.report.score)
                if reason:
                    view.drop(reason)
                    continue
                view.consumed.add(record.id)  # one report per record: a later one on it is not news
                obs = observation_of(record, item, feedback)
                if held_out(record.id, self.holdout_fraction, HOLDOUT_SALT):
                    self.held_out.append(obs)
                elif obs.score < self.config.failure_below:
                    self.failures.append(obs)
                else:
                    self.successes.append(obs)
        overflow = len(self.failures) - MAX_PENDING
        if overflow > 0:
            self.failures = self.failures[overflow:]
            view.drop("pending_overflow", overflow)

    def instruct(self, instruction: Instruction, view: LearnerView) -> None:
        """Take an operator's instruction: it becomes a candidate of its own, before any failure."""
        if instruction.id in view.consumed:
            view.drop("already_used")
            return
        view.consumed.add(instruction.id)
        self.instructions.append(instruction)

    def _ineligible(self, record: Record, consumed: set[str], feedback: str, score: float) -> str | None:
        if record.id in consumed:
            return "already_used"
        if record.status is not RecordStatus.COMPLETE:
            return "not_complete"
        failure = score < self.config.failure_below
        if (
            failure
            and self.proposer.needs_feedback
            and not feedback
            and not held_out(record.id, self.holdout_fraction, HOLDOUT_SALT)
        ):
            return "no_feedback"  # a failure the model-free proposer cannot read
        return None

    # -- batches ------------------------------------------------------------------------------

    async def next_batch(self, view: LearnerView) -> Batch | None:
        """The batch the proposer wants now, removed from the waiting lists; None to wait. An
        instruction goes first; failures only while the training mode lets traffic train."""
        if self.instructions:
            return Batch((), (), self.instructions.pop(0))
        if not view.from_traffic:
            return None
        chosen = self.proposer.select(self.failures, self._head_tree(view.head().release_id, await view.head_files()))
        if not chosen:
            return None
        taken = {o.record_id for o in chosen}
        self.failures = [o for o in self.failures if o.record_id not in taken]
        successes = tuple(self.successes)[-self.config.successes :] if self.config.successes else ()
        for obs in successes:
            self.successes.remove(obs)
        return Batch(tuple(chosen), successes)

    def resume(self, items: Sequence[ReportedRecords]) -> Batch:
        if items and (instruction := instruction_in(items[0])) is not None:
            return Batch((), (), instruction)
        observations = [observation_of(item.records[0], item, feedback_text(item.report.feedback)) for item in items]
        return Batch(
            tuple(o for o in observations if o.score < self.config.failure_below),
            tuple(o for o in observations if o.score >= self.config.failure_below),
        )

    def high_water(self, cursor: int) -> int:
        """Below the lowest report sequence still waiting, so a restart reads those again."""
        seqs = [o.report_seq for o in (*self.failures, *self.successes)] + [i.report_seq for i in self.instructions]
        return min(seqs) - 1 if seqs else cursor

    # -- the candidate --------------------------------------------------------------------------

    async def candidate(self, batch: Batch, job: Job) -> Made:
        """The proposer's mutations applied to the head's tree; the head's weights stay."""
        tree = self._head_tree(job.head.release_id, job.head_files)
        try:
            proposal = await self._proposal(tree, batch, job)
            changed = tree.apply(proposal.mutations)
            if changed.content_id == tree.content_id:
                raise Abandon("no_change", "the proposal leaves the harness as it is")
        except InvalidInput as exc:
            raise self._failed(Abandon("invalid_mutation", f"the proposal does not fit the tree: {exc}")) from None
        except Abandon as exc:
            raise self._failed(exc) from None
        job.algorithm_state["candidates"] = int(job.algorithm_state.get("candidates", 0)) + 1
        mutations = [m.to_json() for m in proposal.mutations]
        return Made(
            merge_files(job.head_files, changed),
            metadata={"mutations": mutations},
            metrics={"proposal": {**proposal.notes, "mutations": mutations}},
            held_out=[o.as_task() for o in self.held_out],
        )

    async def _proposal(self, tree: HarnessTree, batch: Batch, job: Job) -> Proposal:
        if batch.instruction is not None:  # the operator's words as they are: no proposer rewrites them
            rule = instruction_rule(tree, batch.instruction)
            return Proposal((rule,), {"proposer": "instruction", "instruction_id": batch.instruction.id})
        return await self.proposer.propose(tree, batch, job.serving)

    def _failed(self, exc: Abandon) -> Abandon:
        self.proposer_failures[exc.kind] += 1
        self.last_proposer_failures.append(f"{exc.kind}: {exc.reason}"[:500])
        return exc

    def _head_tree(self, release_id: str, files: dict[str, bytes]) -> HarnessTree:
        if self._tree is None or self._tree[0] != release_id:
            self._tree = (release_id, HarnessTree.from_files(files))
        return self._tree[1]

    def status(self) -> JSON:
        return {
            "proposer": self.proposer.name,
            "waiting_failures": len(self.failures),
            "waiting_instructions": len(self.instructions),
            "waiting_successes": len(self.successes),
            "held_out": len(self.held_out),
            "proposer_failures": dict(self.proposer_failures),
            "last_proposer_failures": list(self.last_proposer_failures),
        }

    async def close(self) -> None:
        await self.proposer.close()


def observation_of(record: Record, item: ReportedRecords, feedback: str) -> Observation:
    messages = client_messages(record)
    prompt = "\n\n".join(f"[{m['role']}] {m.get('content') or ''}" for m in messages if m["role"] != "system")
    response = str((record.response or {}).get("text") or "")
    return Observation(
        record.id, item.report.id, item.cursor, float(item.report.score), feedback, prompt, response, tuple(messages)
    )


def client_messages(record: Record) -> list[dict[str, Any]]:
    """The conversation as the client sent it: the harness inject mode added is taken out."""
    request = client_request(record.request, record.harness)
    return [dict(m) for m in request.get("messages") or () if isinstance(m, dict) and "role" in m]


def feedback_text(feedback: str | dict[str, Any] | None) -> str:
    """A report's feedback as one text: a string as is, a JSON object by its usual text fields."""
    if feedback is None:
        return ""
    if isinstance(feedback, str):
        return feedback.strip()
    for key in FEEDBACK_KEYS:
        value = feedback.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return json.dumps(feedback, sort_keys=True)
