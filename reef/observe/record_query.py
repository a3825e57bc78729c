"""What `iter_records` asks of a store and what it gives back, shaped alike by both backends.

A `RecordQuery` is the SELECT of one page of a scenario's records, its filters as bound
parameters in the backend's placeholder style, the page cursor bounding `seq` from the side the
pages walk away from (so the index on (scenario, seq) serves both directions). `RecordQuery.page`
turns a page's rows into `StoredRecord`s with the reports that name them; each backend only runs
the SQL, in one snapshot a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

from reef.core.types import Record, RecordStatus, Report
from reef.observe import rules

Row = Sequence[Any]  # body, seq, created_at, finished_at


@dataclass(frozen=True)
class StoredRecord:
    """A record as `iter_records` reads it: with the store's clock (epoch seconds when it was
    stored and finished) and the reports that name it, oldest first."""

    record: Record
    created_at: float
    finished_at: float | None
    reports: tuple[Report, ...]
    session: str | None = None  # the request's session, or the one a learner stitched it into


@dataclass(frozen=True)
class RecordPage:
    records: list[StoredRecord]
    full: bool  # as many rows as a page holds: there may be more after it
    last_seq: int  # the next page's cursor


@dataclass(frozen=True)
class RecordQuery:
    """`iter_records`' arguments (see `ExperienceStore.iter_records`)."""

    scenario: str
    release_id: str | None = None
    statuses: Collection[RecordStatus] | None = None
    since: float | None = None
    until: float | None = None
    reported_only: bool = False
    after_seq: int = 0
    page_size: int = 500
    newest_first: bool = False
    before_seq: int | None = None  # newest_first: start below this sequence (the next page of a listing)

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError("page_size must be at least 1")

    def first_cursor(self) -> int:
        if not self.newest_first:
            return self.after_seq
        return rules.NO_SEQ_ABOVE if self.before_seq is None else self.before_seq

    def select(self, mark: str) -> str:
        """The SELECT of one page, `mark` the backend's placeholder (`?`, `%s`); its
        parameters are `params(cursor)`."""
        clauses = [f"scenario = {mark}", f"seq < {mark}" if self.newest_first else f"seq > {mark}", f"seq > {mark}"]
        if self.statuses is not None:
            statuses = self._status_values()
            clauses.append(f"status IN ({', '.join([mark] * len(statuses))})" if statuses else "1 = 0")
        if self.since is not None:
            clauses.append(f"created_at >= {mark}")
        if self.until is not None:
            clauses.append(f"created_at < {mark}")
        if self.reported_only:
            clauses.append("EXISTS (SELECT 1 FROM report_refs f WHERE f.record_id = records.id)")
        return (
            f"SELECT body, seq, created_at, finished_at, session FROM records WHERE {' AND '.join(clauses)}"
            f" ORDER BY seq {'DESC' if self.newest_first else 'ASC'} LIMIT {mark}"
        )

    def params(self, cursor: int) -> list[Any]:
        params: list[Any] = [self.scenario, cursor, self.after_seq]
        if self.statuses is not None:
            params += self._status_values()
        params += [t for t in (self.since, self.until) if t is not None]
        return [*params, self.page_size]

    def _status_values(self) -> list[str]:
        return sorted({RecordStatus(s).value for s in self.statuses or ()})

    def page(
        self, rows: Sequence[Row], cursor: int, reports_naming: Callable[[list[str]], dict[str, list[Report]]]
    ) -> RecordPage:
        """The page that `rows` (read at `cursor`) hold, each record with the reports that
        `reports_naming` (read in the same snapshot) finds for it."""
        records = [
            (rules.record_from_row(body, int(seq)), created, finished, session)
            for body, seq, created, finished, session in rows
        ]
        if self.release_id is not None:
            records = [r for r in records if r[0].release is not None and r[0].release.release_id == self.release_id]
        reports = reports_naming([r[0].id for r in records])
        return RecordPage(
            [
                StoredRecord(record, created, finished, tuple(reports.get(record.id, ())), session)
                for record, created, finished, session in records
            ],
            full=len(rows) >= self.page_size,
            last_seq=int(rows[-1][1]) if rows else cursor,
        )
