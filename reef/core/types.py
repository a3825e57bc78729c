"""The nouns of Reef (docs/architecture.md) as plain, immutable data.

Each type converts to and from a JSON-ready dict (`to_json` / `from_json`); the durable layers
store exactly that form, so equality of two things is equality of their canonical JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Mapping

from reef.core.canonical import check_finite, check_id, check_scenario_name, content_id_of
from reef.core.errors import InvalidInput

JSON = dict[str, Any]


class RecordStatus(str, Enum):
    IN_PROGRESS = "in_progress"
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"


class Operation(str, Enum):
    """What one commit-log step did. The first four publish a release; the rest do not."""

    CREATION = "creation"
    TRAINING = "training"
    ROLLBACK = "rollback"
    PROMOTE = "promote"
    REJECTION = "rejection"  # a candidate the gate refused, or one held for review
    BATCH = "batch"  # a learner took a batch; logged before training starts
    ABANDON = "abandon"  # a logged batch that will not be trained
    COMPACTION = "compaction"  # consumed records deleted from the experience store
    SETTINGS = "settings"  # a change of the scenario's training mode or live learner settings
    INSTRUCTION = "instruction"  # an operator's instruction to learn from (POST /reef/train)
    TRAIN_NOW = "train_now"  # an operator asked for the next batch (POST /reef/scenarios/{s}/train-now)


RELEASE_OPERATIONS = frozenset({Operation.CREATION, Operation.TRAINING, Operation.ROLLBACK, Operation.PROMOTE})


class ArtifactKind(str, Enum):
    WEIGHTS = "weights"
    HARNESS = "harness"
    BOTH = "both"
    EMPTY = "empty"


@dataclass(frozen=True)
class Candidate:
    """Content to publish: files of a LoRA adapter, a harness tree, or both."""

    files: Mapping[str, bytes]
    kind: ArtifactKind
    source: JSON = field(default_factory=lambda: {"kind": "training"})
    metadata: JSON = field(default_factory=dict)

    @property
    def content_id(self) -> str:
        return content_id_of(self.files)


@dataclass(frozen=True)
class ReleaseRef:
    """The release a request was frozen to: the decision, its content, and the concrete load."""

    release_id: str
    content_id: str
    runtime_load_id: str | None = None

    def to_json(self) -> JSON:
        return {"release_id": self.release_id, "content_id": self.content_id, "runtime_load_id": self.runtime_load_id}

    @classmethod
    def from_json(cls, data: JSON) -> ReleaseRef:
        try:
            return cls(str(data["release_id"]), str(data["content_id"]), data.get("runtime_load_id"))
        except (KeyError, TypeError) as exc:
            raise InvalidInput(f"release needs release_id and content_id: {exc}") from None


@dataclass(frozen=True)
class TokenSpan:
    """Generated tokens [start, end) came from one runtime load."""

    start: int
    end: int
    runtime_load_id: str

    def to_json(self) -> JSON:
        return {"start": self.start, "end": self.end, "runtime_load_id": self.runtime_load_id}

    @classmethod
    def from_json(cls, data: JSON) -> TokenSpan:
        return cls(int(data["start"]), int(data["end"]), str(data["runtime_load_id"]))


@dataclass(frozen=True)
class Record:
    """One exchange. `id` is the receipt handed to the client."""

    id: str
    scenario: str
    release: ReleaseRef | None
    request: JSON
    status: RecordStatus = RecordStatus.IN_PROGRESS
    response: JSON | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    spans: list[TokenSpan] = field(default_factory=list)
    session: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # why a record is incomplete
    harness: JSON | None = None  # what inject mode added to the client's request (reef/surfaces/inject.py)
    client: str | None = None  # the client's User-Agent (shown by the dashboard); not part of the content
    imported: bool = False  # brought in by `POST /reef/records/batch`: served elsewhere, no release, no tokens
    seq: int | None = None  # store order; assigned by the store, not part of the content

    def __post_init__(self) -> None:
        check_id(self.id, "record id")
        check_scenario_name(self.scenario)
        if self.session is not None:
            check_id(self.session, "session")

    def content(self) -> JSON:
        """Everything that identifies the exchange: what a retry must repeat exactly."""
        data = {
            "id": self.id,
            "scenario": self.scenario,
            "release": self.release.to_json() if self.release else None,
            "request": self.request,
            "session": self.session,
            "tags": dict(self.tags),
        }
        if self.harness is not None:  # absent, not null, so records without one keep their hash
            data["harness"] = self.harness
        if self.imported:  # likewise absent unless set
            data["imported"] = True
        return data

    def outcome(self) -> JSON:
        """What finishing the record adds."""
        return {
            "status": self.status.value,
            "response": self.response,
            "token_ids": self.token_ids,
            "logprobs": self.logprobs,
            "spans": [s.to_json() for s in self.spans],
            "error": self.error,
        }

    def to_json(self) -> JSON:
        data = {**self.content(), **self.outcome(), "timings": dict(self.timings), "seq": self.seq}
        if self.client is not None:  # absent, not null, so records stored before it read back alike
            data["client"] = self.client
        return data

    @classmethod
    def from_json(cls, data: JSON) -> Record:
        release = data.get("release")
        return cls(
            id=data["id"],
            scenario=data["scenario"],
            release=ReleaseRef.from_json(release) if release else None,
            request=data["request"],
            status=RecordStatus(data.get("status", "in_progress")),
            response=data.get("response"),
            token_ids=data.get("token_ids"),
            logprobs=data.get("logprobs"),
            spans=[TokenSpan.from_json(s) for s in data.get("spans") or []],
            session=data.get("session"),
            tags=dict(data.get("tags") or {}),
            timings=dict(data.get("timings") or {}),
            error=data.get("error"),
            harness=data.get("harness"),
            client=data.get("client"),
            imported=bool(data.get("imported", False)),
            seq=data.get("seq"),
        )

    def finished(self, status: RecordStatus, **outcome: Any) -> Record:
        return replace(self, status=status, **outcome)


@dataclass(frozen=True)
class Report:
    """Feedback on one or more receipts. Several references form one trajectory."""

    id: str
    scenario: str
    references: tuple[str, ...]
    score: float
    feedback: str | JSON | None = None
    metadata: JSON = field(default_factory=dict)
    created_at: float | None = None  # assigned by the store; not part of the content
    seq: int | None = None

    def __post_init__(self) -> None:
        check_id(self.id, "report id")
        check_scenario_name(self.scenario)
        if not self.references:
            raise InvalidInput("a report needs at least one reference")
        for ref in self.references:
            check_id(ref, "reference")
        check_finite(self.score, "score")
        if self.feedback is not None and not isinstance(self.feedback, (str, dict)):
            raise InvalidInput("feedback must be text or a JSON object")
        if not isinstance(self.metadata, dict):
            raise InvalidInput("metadata must be a JSON object")

    def content(self) -> JSON:
        return {
            "id": self.id,
            "scenario": self.scenario,
            "references": list(self.references),
            "score": float(self.score),
            "feedback": self.feedback,
            "metadata": self.metadata,
        }

    def to_json(self) -> JSON:
        return {**self.content(), "created_at": self.created_at, "seq": self.seq}

    @classmethod
    def from_json(cls, data: JSON) -> Report:
        return cls(
            id=data["id"],
            scenario=data["scenario"],
            references=tuple(data["references"]),
            score=data["score"],
            feedback=data.get("feedback"),
            metadata=dict(data.get("metadata") or {}),
            created_at=data.get("created_at"),
            seq=data.get("seq"),
        )


@dataclass(frozen=True)
class ReportedRecords:
    """A report with the records it refers to, as the learner reads them."""

    report: Report
    records: tuple[Record, ...]

    @property
    def cursor(self) -> int:
        assert self.report.seq is not None
        return self.report.seq


@dataclass(frozen=True)
class Verdict:
    """The gate's decision on a candidate: `select`, `reject` or `review` (selected, held)."""

    decision: str
    metrics: JSON = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.decision not in ("select", "reject", "review"):
            raise InvalidInput(f"verdict must be select, reject or review, got {self.decision!r}")

    def to_json(self) -> JSON:
        return {"decision": self.decision, "metrics": self.metrics}

    @classmethod
    def from_json(cls, data: JSON | None) -> Verdict | None:
        return cls(data["decision"], dict(data.get("metrics") or {})) if data else None


COMMIT_FORMAT = "reef-commit/1"


@dataclass(frozen=True)
class CommitEntry:
    """One line of a scenario's commit log: one step.

    `release` is the release the step is about: a new one for release operations (a pending one
    for a candidate held for review), the unchanged head for the others (a rejection, a batch,
    a compaction). The head is the release of the last release operation that is not pending;
    it is derived from the log, never stored twice. `high_water` is the experience-store cursor
    (report sequence) the learner has consumed up to.
    """

    scenario: str
    step: int
    operation: Operation
    release: ReleaseRef
    parent_release_id: str | None = None
    checkpoint: bool = False
    pending: bool = False  # a selected release held for review; the head does not move
    verdict: Verdict | None = None
    algorithm_state: JSON | None = None
    high_water: int = 0
    compacted_ids: tuple[str, ...] = ()
    batch: JSON | None = None  # {"batch_id", "record_ids", "report_ids", "from_release_id"}
    binding: JSON | None = None  # creation only: {"recipe", "starting_release_id"}
    rollback_target_release_id: str | None = None
    metrics: JSON = field(default_factory=dict)
    recorded_at: float = 0.0

    @property
    def publishes_release(self) -> bool:
        return self.operation in RELEASE_OPERATIONS

    def identity(self) -> JSON:
        """The line without its time: an identical retry compares equal on this."""
        data = self.to_json()
        del data["recorded_at"]
        return data

    def to_json(self) -> JSON:
        return {
            "record": COMMIT_FORMAT,
            "scenario": self.scenario,
            "step": self.step,
            "operation": self.operation.value,
            "release": self.release.to_json(),
            "parent_release_id": self.parent_release_id,
            "checkpoint": self.checkpoint,
            "pending": self.pending,
            "verdict": self.verdict.to_json() if self.verdict else None,
            "algorithm_state": self.algorithm_state,
            "record_progress": {"high_water": self.high_water, "compacted_ids": list(self.compacted_ids)},
            "batch": self.batch,
            "binding": self.binding,
            "rollback_target_release_id": self.rollback_target_release_id,
            "metrics": self.metrics,
            "recorded_at": self.recorded_at,
        }

    @classmethod
    def from_json(cls, data: JSON) -> CommitEntry:
        if data.get("record") != COMMIT_FORMAT:
            raise InvalidInput(f"not a {COMMIT_FORMAT} line: record={data.get('record')!r}")
        progress = data.get("record_progress") or {}
        step = data["step"]
        if not isinstance(step, int) or isinstance(step, bool):
            raise InvalidInput(f"step must be an integer, got {step!r}")
        return cls(
            scenario=data["scenario"],
            step=step,
            operation=Operation(data["operation"]),
            release=ReleaseRef.from_json(data["release"]),
            parent_release_id=data.get("parent_release_id"),
            checkpoint=bool(data.get("checkpoint", False)),
            pending=bool(data.get("pending", False)),
            verdict=Verdict.from_json(data.get("verdict")),
            algorithm_state=data.get("algorithm_state"),
            high_water=int(progress.get("high_water", 0)),
            compacted_ids=tuple(progress.get("compacted_ids") or ()),
            batch=data.get("batch"),
            binding=data.get("binding"),
            rollback_target_release_id=data.get("rollback_target_release_id"),
            metrics=dict(data.get("metrics") or {}),
            recorded_at=float(data.get("recorded_at", 0.0)),
        )


@dataclass(frozen=True)
class Release:
    """One publication decision, as the release chain lists it."""

    scenario: str
    step: int
    operation: Operation
    ref: ReleaseRef
    parent_release_id: str | None
    verdict: Verdict | None
    pending: bool
    metrics: JSON
    recorded_at: float
    rollback_target_release_id: str | None = None

    @property
    def release_id(self) -> str:
        return self.ref.release_id

    @property
    def content_id(self) -> str:
        return self.ref.content_id

    @classmethod
    def from_entry(cls, entry: CommitEntry) -> Release:
        return cls(
            scenario=entry.scenario,
            step=entry.step,
            operation=entry.operation,
            ref=entry.release,
            parent_release_id=entry.parent_release_id,
            verdict=entry.verdict,
            pending=entry.pending,
            metrics=entry.metrics,
            recorded_at=entry.recorded_at,
            rollback_target_release_id=entry.rollback_target_release_id,
        )

    def to_json(self) -> JSON:
        return {
            "scenario": self.scenario,
            "step": self.step,
            "operation": self.operation.value,
            **self.ref.to_json(),
            "parent_release_id": self.parent_release_id,
            "verdict": self.verdict.to_json() if self.verdict else None,
            "pending": self.pending,
            "metrics": self.metrics,
            "recorded_at": self.recorded_at,
            "rollback_target_release_id": self.rollback_target_release_id,
        }
