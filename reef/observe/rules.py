"""The store rules both backends share: identity, the finish transition, reference checks.

Backends keep only SQL here and there; every decision about what is a retry, a conflict or a
missing reference is made by these functions, so SQLite and PostgreSQL cannot drift apart.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from reef.core.canonical import canonical_json, content_hash
from reef.core.errors import InvalidInput, NotFound, RecordConflict, ReefError
from reef.core.types import Record, RecordStatus, Report, TokenSpan

NO_SEQ_ABOVE = 2**63 - 1  # above every sequence number either backend hands out (a signed 64-bit integer)


def record_content_hash(record: Record) -> str:
    return content_hash(record.content())


def record_body(record: Record) -> str:
    data = record.to_json()
    data.pop("seq", None)
    return canonical_json(data)


def report_identity_hash(report: Report) -> str:
    return content_hash(report.content())


def with_distinct_references(report: Report) -> Report:
    """The report naming each receipt once, in the order first named. A receipt named twice is
    one step of the trajectory, not two samples: a learner would otherwise train on its copies.
    Both backends store reports so, and read so any stored before this rule."""
    distinct = tuple(dict.fromkeys(report.references))
    return report if distinct == report.references else replace(report, references=distinct)


def report_body(report: Report) -> str:
    data = report.to_json()
    data.pop("seq", None)
    return canonical_json(data)


@dataclass(frozen=True)
class Outcome:
    """What finishing a record adds: the arguments of `ExperienceStore.finish_record`."""

    status: RecordStatus
    response: dict | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    spans: Sequence[TokenSpan] = ()
    error: str | None = None
    timings: dict[str, float] | None = None

    @classmethod
    def of(cls, record: Record) -> Outcome:
        return cls(
            record.status,
            record.response,
            record.token_ids,
            record.logprobs,
            record.spans,
            record.error,
            record.timings,
        )


def resolve_record_retry(stored: Record, new: Record) -> tuple[Record, bool]:
    """Decide a put of an id that exists: `(record, False)` to return the stored record as is,
    or `(finished, True)` to finish the stored in-progress record with `new`'s outcome (timings
    merged, as `finish_record` does). Raises `RecordConflict` on other content."""
    if canonical_json(stored.content()) != canonical_json(new.content()):
        raise RecordConflict(f"record {new.id} already exists with other content")
    if new.status is RecordStatus.IN_PROGRESS:
        return stored, False
    done = finished(stored, Outcome.of(new))
    return (stored, False) if done is None else (done, True)


def finished(stored: Record, outcome: Outcome) -> Record | None:
    """The finished form of `stored`, or `None` when it is an identical retry of a finish."""
    if outcome.status is RecordStatus.IN_PROGRESS:
        raise InvalidInput("a record can only be finished as complete or incomplete")
    candidate = replace(
        stored,
        status=outcome.status,
        response=outcome.response,
        token_ids=outcome.token_ids,
        logprobs=outcome.logprobs,
        spans=list(outcome.spans),
        error=outcome.error,
        timings={**stored.timings, **(outcome.timings or {})},
    )
    if stored.status is not RecordStatus.IN_PROGRESS:
        if canonical_json(stored.outcome()) == canonical_json(candidate.outcome()):
            return None
        raise RecordConflict(f"record {stored.id} is already {stored.status.value}; records are never overwritten")
    return candidate


def check_replaceable(stored: Record, new: Record, *, reported: bool) -> None:
    """Whether `new`, a new attempt under the id of `stored`, may replace it: only an `incomplete`
    record (its attempt failed: nothing was answered) of the same scenario, session and tags that
    no report names. The caller checked that `new` asks the same as `stored` did."""
    if (stored.scenario, stored.session, stored.tags) != (new.scenario, new.session, new.tags):
        raise RecordConflict(f"record {new.id} already exists with other content")
    if stored.status is RecordStatus.IN_PROGRESS:
        raise RecordConflict(f"record {new.id} is still being answered (in_progress)")
    if stored.status is RecordStatus.COMPLETE:
        raise RecordConflict(f"record {new.id} is already complete; records are never overwritten")
    if reported:
        raise RecordConflict(f"record {new.id} is incomplete and a report names it, so it is kept as it is")


def check_report_retry(stored: Report, new: Report) -> Report:
    if canonical_json(stored.content()) != canonical_json(new.content()):
        raise RecordConflict(f"report {new.id} already exists with other content")
    return stored


def require_references(report: Report, known: Iterable[str]) -> None:
    known_set = set(known)
    missing = [ref for ref in report.references if ref not in known_set]
    if missing:
        raise NotFound(
            f"report {report.id} references unknown records in scenario {report.scenario!r}: {', '.join(missing)}"
        )


BatchItem = tuple[Record, "Report | None"]  # a record with the report that scores it, if any


def store_batch(
    items: Sequence[BatchItem], put_record: Callable[[Record], Record], put_report: Callable[[Report], Report]
) -> list[BatchItem]:
    """Put each item in order inside the caller's one transaction; an item that fails raises
    its error named `records[i].id` (its record) or `records[i].score` (its report), so the
    caller rolls the whole batch back and the client knows which item to fix."""
    stored: list[BatchItem] = []
    for i, (record, report) in enumerate(items):
        field = "id"
        try:
            kept = put_record(record)
            field = "score"
            stored.append((kept, put_report(report) if report is not None else None))
        except ReefError as exc:
            raise _named(exc, f"records[{i}].{field}") from None
    return stored


def _named(exc: ReefError, where: str) -> ReefError:
    named = copy.copy(exc)
    named.args = (f"{where}: {exc}",)
    return named


def record_from_row(body: str, seq: int) -> Record:
    data: dict[str, Any] = json.loads(body)
    data["seq"] = seq
    return Record.from_json(data)


def report_from_row(body: str, seq: int) -> Report:
    data: dict[str, Any] = json.loads(body)
    data["seq"] = seq
    return with_distinct_references(Report.from_json(data))


def reports_by_record(rows: Iterable[tuple[str, str, int]]) -> dict[str, list[Report]]:
    """Rows of (record id, report body, report seq) in seq order as the reports that name each
    record, oldest first (a report naming several is parsed once)."""
    out: dict[str, list[Report]] = {}
    parsed: dict[int, Report] = {}
    for record_id, body, seq in rows:
        report = parsed.get(seq) or parsed.setdefault(seq, report_from_row(body, int(seq)))
        out.setdefault(record_id, []).append(report)
    return out
