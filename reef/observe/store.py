"""The experience store interface: records and reports, durable before any call returns.

Two implementations: `SQLiteStore` (the default, one file in the state directory) and
`PostgresStore` (for several front ends sharing one store). Both follow the same rules:

- A record is created once. Putting it again with identical content (request, release,
  session, tags and, when given, outcome) is idempotent and returns the stored record; other
  content under the same id raises `RecordConflict`.
- A record moves once from `in_progress` to `complete` or `incomplete` (`finish_record`), and
  is never overwritten after that; finishing it again identically is idempotent. The one
  exception: a new attempt at the same request may replace an `incomplete` record that no
  report names (`replace_incomplete`: a client's retry under its own receipt).
- A record `in_progress` belongs to the open store that wrote it; once that store's process is
  gone, the next store opened on the same data marks it `incomplete` (instances.py).
- A report must reference records of its own scenario; the error names every missing one.
- Records are deleted only by `compact`, which keeps a tombstone (id and content hash) so a
  late retry still deduplicates; the commit layer logs every compaction.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Any, Collection, Iterator, Sequence

from reef.core.types import Record, RecordStatus, Report, ReportedRecords, TokenSpan
from reef.observe.record_query import RecordPage, RecordQuery, StoredRecord
from reef.observe.rules import BatchItem, Outcome


class ExperienceStore(ABC):
    @abstractmethod
    def put_record(self, record: Record) -> Record:
        """Store a new record (any status); idempotent on identical content."""

    def finish_record(
        self,
        record_id: str,
        status: RecordStatus,
        *,
        response: dict | None = None,
        token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        spans: Sequence[TokenSpan] = (),
        error: str | None = None,
        timings: dict[str, float] | None = None,
    ) -> Record:
        """Move an `in_progress` record to `complete` or `incomplete`."""
        return self._finish_record(record_id, Outcome(status, response, token_ids, logprobs, spans, error, timings))

    @abstractmethod
    def _finish_record(self, record_id: str, outcome: Outcome) -> Record:
        """`finish_record`: the record as `rules.finished` makes it, stored (the stored record
        when it is an identical retry); `NotFound` if there is none."""

    @abstractmethod
    def replace_incomplete(self, record: Record) -> Record:
        """Store `record`, a new attempt at the same request (the caller checked), in place of the
        `incomplete` record of its id: same seq, the new attempt's status, content and outcome
        (a record `in_progress` again is this store's to finish). `RecordConflict` naming the
        state if that record is not `incomplete`, or a report names it, or its scenario, session
        or tags differ; `NotFound` if there is none."""

    @abstractmethod
    def get_record(self, record_id: str) -> Record:
        """The stored record; `NotFound` if it does not exist (or was compacted)."""

    @abstractmethod
    def put_report(self, report: Report) -> Report:
        """Store a report; idempotent on identical content; `NotFound` names missing references."""

    @abstractmethod
    def get_report(self, report_id: str) -> Report: ...

    @abstractmethod
    def put_batch(self, items: Sequence[BatchItem]) -> list[BatchItem]:
        """Store records, each with its report or none, in one transaction: all or none. Each
        item is decided as `put_record` and `put_report` decide it (an identical retry returns
        what is stored, other content raises `RecordConflict`); the first item that fails names
        itself in the error (`rules.store_batch`) and nothing of the batch is kept."""

    @abstractmethod
    def reports_for(self, record_id: str) -> list[Report]:
        """Reports that reference one record, oldest first."""

    @abstractmethod
    def reported_since(self, scenario: str, cursor: int = 0, limit: int = 1000) -> list[ReportedRecords]:
        """Reports of a scenario with sequence above `cursor`, in sequence order, with their
        live records. The learner keeps the last `cursor` it consumed in the commit log."""

    @abstractmethod
    def session_records(self, scenario: str, session: str) -> list[Record]:
        """Records of one session, in the order they were created."""

    def iter_records(
        self,
        scenario: str,
        *,
        release_id: str | None = None,
        statuses: Collection[RecordStatus] | None = None,
        since: float | None = None,
        until: float | None = None,
        reported_only: bool = False,
        after_seq: int = 0,
        page_size: int = 500,
        newest_first: bool = False,
        before_seq: int | None = None,
    ) -> Iterator[StoredRecord]:
        """The live records of a scenario in sequence order (`newest_first`: the reverse), each
        with its reports, read a page at a time (each page one snapshot) along the index on
        (scenario, seq), so memory stays flat however many there are and the newest `n` cost
        `n` rows read, not the whole scenario. Filters: the frozen release, statuses (None:
        any), stored at `since` <= t < `until` (epoch seconds), only records some report names,
        sequence above `after_seq` (and, `newest_first`, below `before_seq`). A record committed while the iteration runs may or may not
        be seen."""
        query = RecordQuery(
            scenario, release_id, statuses, since, until, reported_only, after_seq, page_size, newest_first, before_seq
        )
        cursor = query.first_cursor()
        while True:
            page = self._records_page(query, cursor)
            yield from page.records
            if not page.full:
                return
            cursor = page.last_seq

    @abstractmethod
    def _records_page(self, query: RecordQuery, cursor: int) -> RecordPage:
        """One page of `iter_records` from `cursor` on, read in one snapshot (`RecordQuery.page`)."""

    @abstractmethod
    def compact(self, scenario: str, record_ids: Sequence[str]) -> int:
        """Delete records (keeping tombstones); idempotent; returns how many were deleted now."""

    @abstractmethod
    def stitch_session(self, record_id: str, session: str) -> bool:
        """Name the session a learner stitched a record into, when its request named none: the
        store's session column only (sessions are listed and read back by it), never the record's
        content, which keeps what the client sent. True when it was set now."""

    @abstractmethod
    def archive_scenario(self, scenario: str, archived_as: str) -> int:
        """Move the scenario's records, reports and tombstones aside under `archived_as` (a name
        no scenario can have: `reef/commit/archive.py`), in one transaction; nothing is deleted
        and no record's content changes. How many records moved."""

    @abstractmethod
    def count_records(self, scenario: str | None = None) -> int: ...

    @abstractmethod
    def count_reports(self, scenario: str | None = None) -> int: ...

    @abstractmethod
    def close(self) -> None: ...

    def health(self) -> str | None:
        """None while the store can take writes when asked; else why it cannot (a stopped
        writer). A full disk is not a health problem: writes fail with 503 and recover."""
        return None

    # The server awaits these; a backend with its own async path overrides them.

    async def aput_record(self, record: Record) -> Record:
        return await asyncio.to_thread(self.put_record, record)

    async def afinish_record(self, record_id: str, status: RecordStatus, **outcome: Any) -> Record:
        return await self._afinish_record(record_id, Outcome(status, **outcome))

    async def _afinish_record(self, record_id: str, outcome: Outcome) -> Record:
        return await asyncio.to_thread(self._finish_record, record_id, outcome)

    async def aput_report(self, report: Report) -> Report:
        return await asyncio.to_thread(self.put_report, report)

    async def areplace_incomplete(self, record: Record) -> Record:
        return await asyncio.to_thread(self.replace_incomplete, record)

    def __enter__(self) -> ExperienceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
