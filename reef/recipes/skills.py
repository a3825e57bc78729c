"""Skills: the harness recipe. Reported records in, mutations of the harness tree out.

Each reported record becomes an observation: its score, the report's textual feedback, the
client's prompt and the answer. A score below `failure_below` is a failure. Failures wait in a
pending list (at most `max_pending`, the oldest dropped first) until the proposer says which of
them make a batch: the LLM proposer takes the `batch_size` lowest-scored failures once that many
wait; the model-free proposer takes the failures whose feedback forms a theme that recurs at
least `min_recurrence` times. A batch also carries the `successes` most recent successes, for
contrast. Without evaluation tasks in the gate's config, a fixed hash-chosen fraction of records
(`gate.holdout_fraction`) is never shown to the proposer and serves the gate as held-out tasks.

A record is used at most once: every record a logged batch named (published, rejected or
abandoned) is consumed for good.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence

from reef.config import SkillsConfig
from reef.core.types import Record, RecordStatus, ReportedRecords
from reef.surfaces.harness import HarnessTree, Mutation
from reef.surfaces.inject import client_request

NAME = "skills"
FEEDBACK_KEYS = ("feedback", "message", "reason", "comment", "text", "note", "explanation")
SUCCESS_KEEP = 32


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
        return {"messages": [dict(m) for m in self.messages], "reported_score": self.score,
                "feedback": self.feedback, "record_id": self.record_id}


@dataclass(frozen=True)
class Batch:
    failures: tuple[Observation, ...]
    successes: tuple[Observation, ...] = ()

    @property
    def observations(self) -> tuple[Observation, ...]:
        return self.failures + self.successes

    @property
    def record_ids(self) -> list[str]:
        return [o.record_id for o in self.observations]

    @property
    def report_ids(self) -> list[str]:
        return sorted({o.report_id for o in self.observations})


@dataclass(frozen=True)
class Proposal:
    mutations: tuple[Mutation, ...]
    notes: dict[str, Any] = field(default_factory=dict)  # what the proposer wants in the chain


class ProposalFailed(Exception):
    """The proposer gave nothing usable; `reason` goes into the log and the learner status."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class Proposer(Protocol):
    name: str
    needs_feedback: bool

    def select(self, failures: Sequence[Observation], tree: HarnessTree) -> list[Observation]:
        """Which waiting failures make a batch now (empty: wait for more)."""

    async def propose(self, tree: HarnessTree, batch: Batch, serving: Any) -> Proposal:
        """Mutations of `tree` for this batch; `ProposalFailed` when there are none to give."""

    async def close(self) -> None:
        """Release what the proposer holds (a model's connection pool)."""


@dataclass
class Intake:
    failures: list[Observation] = field(default_factory=list)
    successes: list[Observation] = field(default_factory=list)
    held_out: list[Observation] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)


class SkillsRecipe:
    name = NAME

    def __init__(self, config: SkillsConfig, proposer: Proposer, holdout_fraction: float = 0.0) -> None:
        self.config = config
        self.proposer = proposer
        self.holdout_fraction = holdout_fraction
        self.failures: list[Observation] = []
        self.successes: deque[Observation] = deque(maxlen=SUCCESS_KEEP)

    def intake(self, items: Iterable[ReportedRecords], consumed: set[str]) -> Intake:
        """Turn newly reported records into observations, or count why not."""
        out = Intake()
        for item in items:
            missing = len(item.report.references) - len(item.records)
            if missing:
                out.dropped["compacted_or_missing"] += missing
            feedback = feedback_text(item.report.feedback)
            for record in item.records:
                reason = self._ineligible(record, consumed, feedback, item.report.score)
                if reason:
                    out.dropped[reason] += 1
                    continue
                consumed.add(record.id)  # one report per record: a later one on it is not news
                obs = observation_of(record, item, feedback)
                if self._held_out(record.id):
                    out.held_out.append(obs)
                elif obs.score < self.config.failure_below:
                    out.failures.append(obs)
                else:
                    out.successes.append(obs)
        return out

    def take(self, intake: Intake) -> Counter[str]:
        """Add an intake to the waiting lists; returns what overflowed."""
        self.failures.extend(intake.failures)
        self.successes.extend(intake.successes)
        overflow = len(self.failures) - self.config.max_pending
        dropped: Counter[str] = Counter()
        if overflow > 0:
            self.failures = self.failures[overflow:]
            dropped["pending_overflow"] += overflow
        return dropped

    def next_batch(self, tree: HarnessTree) -> Batch | None:
        """The batch the proposer wants now, removed from the waiting lists; None to wait."""
        chosen = self.proposer.select(self.failures, tree)
        if not chosen:
            return None
        taken = {o.record_id for o in chosen}
        self.failures = [o for o in self.failures if o.record_id not in taken]
        successes = tuple(self.successes)[-self.config.successes:] if self.config.successes else ()
        for obs in successes:
            self.successes.remove(obs)
        return Batch(tuple(chosen), successes)

    def waiting_low_seq(self) -> int | None:
        """The lowest report sequence still waiting (the learner's high-water stays below it)."""
        seqs = [o.report_seq for o in (*self.failures, *self.successes)]
        return min(seqs) if seqs else None

    def _ineligible(self, record: Record, consumed: set[str], feedback: str, score: float) -> str | None:
        if record.id in consumed:
            return "already_used"
        if record.status is not RecordStatus.COMPLETE:
            return "not_complete"
        failure = score < self.config.failure_below
        if failure and self.proposer.needs_feedback and not feedback and not self._held_out(record.id):
            return "no_feedback"  # a failure the model-free proposer cannot read
        return None

    def _held_out(self, record_id: str) -> bool:
        digest = hashlib.sha256(("holdout:" + record_id).encode()).digest()
        return int.from_bytes(digest[:4], "big") / 2**32 < self.holdout_fraction


def observation_of(record: Record, item: ReportedRecords, feedback: str) -> Observation:
    messages = client_messages(record)
    prompt = "\n\n".join(f"[{m['role']}] {m.get('content') or ''}" for m in messages if m["role"] != "system")
    response = str((record.response or {}).get("text") or "")
    return Observation(record.id, item.report.id, item.cursor, float(item.report.score), feedback, prompt, response,
                       tuple(messages))


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
