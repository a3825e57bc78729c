"""The PostgreSQL experience store: several front ends sharing one database.

Same tables and rules as `SQLiteStore` (every decision is made in `rules`); each write is one
transaction on a pooled connection, committed with `synchronous_commit=on` before the call
returns. Races between front ends are settled by row locks: a write locks the row it decides
on (`SELECT ... FOR UPDATE`), and an insert that loses a race (`ON CONFLICT DO NOTHING` gives
no row) re-reads the winner and decides again, so a race never surfaces as an integrity error.
Report sequence numbers are taken under a per-scenario advisory lock held to commit, so they
become visible in sequence order and a learner's cursor never skips a report committed late.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Callable, Sequence, TypeVar

import psycopg
from psycopg import sql

from reef.core.canonical import check_id
from reef.core.errors import NotFound, RecordConflict, StorageUnavailable
from reef.core.types import Record, RecordStatus, Report, ReportedRecords
from reef.observe import rules
from reef.observe.instances import PgInstances, interrupted
from reef.observe.pg_connections import (
    ATTEMPTS,
    Connection,
    ConnectionPool,
    Cursor,
    connect,
    describe,
    migrate,
    run_with_retries,
)
from reef.observe.record_query import RecordPage, RecordQuery
from reef.observe.store import ExperienceStore

T = TypeVar("T")

SCHEMA_VERSION = 2
# Runs with search_path set to the store's schema, so the names below live there.
SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    scenario TEXT NOT NULL,
    session TEXT,
    status TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS records_by_scenario ON records (scenario, seq);
CREATE INDEX IF NOT EXISTS records_by_session ON records (scenario, session, seq);
CREATE TABLE IF NOT EXISTS tombstones (
    id TEXT PRIMARY KEY,
    scenario TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    compacted_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    scenario TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS reports_by_scenario ON reports (scenario, seq);
CREATE TABLE IF NOT EXISTS report_refs (
    report_seq BIGINT NOT NULL,
    position INTEGER NOT NULL,
    record_id TEXT NOT NULL,
    PRIMARY KEY (report_seq, position)
);
CREATE INDEX IF NOT EXISTS report_refs_by_record ON report_refs (record_id);
"""
# Version 2: each record `in_progress` names the store instance that may finish it (instances.py).
TRACK_OWNERS = """
ALTER TABLE records ADD COLUMN IF NOT EXISTS owner TEXT;
CREATE INDEX IF NOT EXISTS records_in_progress ON records (owner) WHERE status = 'in_progress';
"""
log = logging.getLogger("reef.store")

_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


class PostgresStore(ExperienceStore):
    def __init__(self, dsn: str, *, schema: str = "reef", pool_size: int = 8) -> None:
        self.dsn = dsn
        self.schema = schema
        self._where = describe(dsn, schema)
        self._pool = ConnectionPool(self._connect, pool_size)
        self._run(self._migrate)
        try:
            self.instances = PgInstances(self._connect, schema)
        except psycopg.Error as exc:
            self._pool.close()
            raise StorageUnavailable(f"{self._where}: {type(exc).__name__}: {exc}") from exc
        self._close_interrupted()

    # -- connections ---------------------------------------------------------------------

    def _connect(self) -> Connection:
        return connect(self.dsn, self.schema)

    def _migrate(self, cur: Cursor) -> None:
        def upgrade(version: int) -> None:
            cur.execute(SCHEMA)
            if version < 2:
                cur.execute(TRACK_OWNERS)
                _mark_interrupted(cur, None)  # left by a Reef before version 2: the processes this upgrade replaces

        migrate(cur, self.schema, self._where, "schema", SCHEMA_VERSION, upgrade)

    def close(self) -> None:
        if self._pool.closed:
            return
        self.instances.close()
        self._pool.close()

    def _close_interrupted(self) -> None:
        """Mark `incomplete` the records that store instances now gone left `in_progress`
        (instances.py); a failure leaves them for the next open."""

        def work(cur: Cursor) -> int:
            owners = [
                row[0]
                for row in cur.execute(
                    "SELECT DISTINCT owner FROM records WHERE status = 'in_progress' AND owner IS NOT NULL"
                )
            ]
            return _mark_interrupted(cur, [owner for owner in owners if not self.instances.alive(owner, cur)])

        try:
            marked = self._run(work)
        except StorageUnavailable as exc:
            log.warning(
                "%s: records left in progress by a stopped server could not be closed now: %s", self._where, exc
            )
            return
        if marked:
            log.warning("%s: %d record(s) left in progress by a stopped server marked incomplete", self._where, marked)

    def _run(self, work: Callable[[Cursor], T], begin: str | None = "BEGIN") -> T:
        """Run `work` in one transaction (`begin=None`: one autocommitted statement) and commit."""
        return run_with_retries(self._pool, self._where, work, begin)

    # -- records -------------------------------------------------------------------------

    def put_record(self, record: Record) -> Record:
        return self._run(self._record_work(record))

    def _record_work(self, record: Record) -> Callable[[Cursor], Record]:
        body = rules.record_body(record)

        def work(cur: Cursor) -> Record:
            for _ in range(ATTEMPTS):
                stored = _load_record(cur, record.id, lock=True)
                if stored is not None:
                    resolved, must_finish = rules.resolve_record_retry(stored, record)
                    return _finish(cur, stored, resolved) if must_finish else resolved
                tomb = cur.execute("SELECT content_hash FROM tombstones WHERE id = %s", (record.id,)).fetchone()
                if tomb is not None:
                    if tomb[0] != rules.record_content_hash(record):
                        raise RecordConflict(f"record {record.id} already existed with other content (compacted)")
                    return record
                seq = _insert_record(cur, record, body, self._owner(record))
                if seq is not None:
                    return replace(record, seq=seq)
                # another front end inserted this id since we looked: decide against its row
            raise StorageUnavailable(f"{self._where}: record {record.id} kept changing under the write")

        return work

    def _owner(self, record: Record) -> str | None:
        """A record `in_progress` is this instance's to finish."""
        return self.instances.id if record.status is RecordStatus.IN_PROGRESS else None

    def replace_incomplete(self, record: Record) -> Record:
        body = rules.record_body(record)

        def work(cur: Cursor) -> Record:
            stored = _load_record(cur, record.id, lock=True)
            if stored is None:
                raise NotFound(f"unknown record {record.id}")
            reported = cur.execute("SELECT 1 FROM report_refs WHERE record_id = %s LIMIT 1", (record.id,)).fetchone()
            rules.check_replaceable(stored, record, reported=reported is not None)
            now = time.time()
            cur.execute(
                "UPDATE records SET status = %s, body = %s, created_at = %s, finished_at = %s, owner = %s WHERE id = %s",
                (
                    record.status.value,
                    body,
                    now,
                    None if record.status is RecordStatus.IN_PROGRESS else now,
                    self._owner(record),
                    record.id,
                ),
            )
            return replace(record, seq=stored.seq)

        return self._run(work)

    def _finish_record(self, record_id: str, outcome: rules.Outcome) -> Record:
        def work(cur: Cursor) -> Record:
            stored = _load_record(cur, record_id, lock=True)
            if stored is None:
                raise NotFound(f"unknown record {record_id}")
            done = rules.finished(stored, outcome)
            return stored if done is None else _finish(cur, stored, done)

        return self._run(work)

    def get_record(self, record_id: str) -> Record:
        stored = self._run(lambda cur: _load_record(cur, record_id), begin=None)
        if stored is None:
            raise NotFound(f"unknown record {record_id}")
        return stored

    def session_records(self, scenario: str, session: str) -> list[Record]:
        def work(cur: Cursor) -> list[Record]:
            rows = cur.execute(
                "SELECT body, seq FROM records WHERE scenario = %s AND session = %s ORDER BY seq", (scenario, session)
            )
            return [rules.record_from_row(body, seq) for body, seq in rows]

        return self._run(work, begin=None)

    def _records_page(self, query: RecordQuery, cursor: int) -> RecordPage:
        def work(cur: Cursor) -> RecordPage:
            rows = cur.execute(query.select("%s"), query.params(cursor)).fetchall()
            return query.page(rows, cursor, lambda ids: _reports_naming(cur, ids))

        return self._run(work, begin=_SNAPSHOT)  # one snapshot per page; no connection held between pages

    def compact(self, scenario: str, record_ids: Sequence[str]) -> int:
        def work(cur: Cursor) -> int:
            deleted = 0
            now = time.time()
            for record_id in sorted(set(record_ids)):  # one lock order for every front end: no deadlock
                stored = _load_record(cur, record_id, lock=True)
                if stored is None or stored.scenario != scenario:
                    continue
                cur.execute(
                    "INSERT INTO tombstones (id, scenario, content_hash, compacted_at) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (id) DO NOTHING",
                    (record_id, scenario, rules.record_content_hash(stored), now),
                )
                cur.execute("DELETE FROM records WHERE id = %s", (record_id,))
                deleted += 1
            return deleted

        return self._run(work)

    def stitch_session(self, record_id: str, session: str) -> bool:
        check_id(session, "session")

        def work(cur: Cursor) -> bool:
            sql_ = "UPDATE records SET session = %s WHERE id = %s AND session IS NULL"
            return cur.execute(sql_, (session, record_id)).rowcount == 1

        return self._run(work)

    def archive_scenario(self, scenario: str, archived_as: str) -> int:
        def work(cur: Cursor) -> int:
            self._reports_lock(cur, scenario)  # no report of the scenario commits halfway through
            for table in ("reports", "tombstones"):
                query = sql.SQL("UPDATE {} SET scenario = %s WHERE scenario = %s").format(sql.Identifier(table))
                cur.execute(query, (archived_as, scenario))
            return cur.execute("UPDATE records SET scenario = %s WHERE scenario = %s", (archived_as, scenario)).rowcount

        return self._run(work)

    def count_records(self, scenario: str | None = None) -> int:
        return self._run(lambda cur: _count(cur, "records", scenario), begin=None)

    # -- reports -------------------------------------------------------------------------

    def put_report(self, report: Report) -> Report:
        return self._run(self._report_work(report))

    def _reports_lock(self, cur: Cursor, scenario: str) -> None:
        """The scenario's report sequence lock, held to commit (taking it again is a no-op)."""
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"reef:{self.schema}:reports:{scenario}",)
        )

    def _report_work(self, report: Report) -> Callable[[Cursor], Report]:
        report = rules.with_distinct_references(report)
        stamped = replace(report, created_at=time.time())
        body = rules.report_body(stamped)  # serialised before the lock is taken

        def work(cur: Cursor) -> Report:
            self._reports_lock(cur, report.scenario)
            for _ in range(ATTEMPTS):
                row = cur.execute("SELECT body, seq FROM reports WHERE id = %s", (report.id,)).fetchone()
                if row is not None:
                    return rules.check_report_retry(rules.report_from_row(*row), report)
                rules.require_references(report, _known_ids(cur, report.scenario, report.references))
                stored = _insert_report(cur, stamped, body)
                if stored is not None:
                    return stored
                # the same id was just stored in another scenario: decide against that row
            raise StorageUnavailable(f"{self._where}: report {report.id} kept changing under the write")

        return work

    def put_batch(self, items: Sequence[rules.BatchItem]) -> list[rules.BatchItem]:
        def work(cur: Cursor) -> list[rules.BatchItem]:
            for scenario in sorted({report.scenario for _, report in items if report is not None}):
                self._reports_lock(cur, scenario)  # in one order for every front end: no deadlock
            return rules.store_batch(items, lambda r: self._record_work(r)(cur), lambda p: self._report_work(p)(cur))

        return self._run(work)

    def get_report(self, report_id: str) -> Report:
        def work(cur: Cursor) -> Report | None:
            row = cur.execute("SELECT body, seq FROM reports WHERE id = %s", (report_id,)).fetchone()
            return rules.report_from_row(*row) if row else None

        stored = self._run(work, begin=None)
        if stored is None:
            raise NotFound(f"unknown report {report_id}")
        return stored

    def reports_for(self, record_id: str) -> list[Report]:
        def work(cur: Cursor) -> list[Report]:
            rows = cur.execute(
                "SELECT body, seq FROM reports WHERE seq IN (SELECT report_seq FROM report_refs WHERE record_id = %s)"
                " ORDER BY seq",
                (record_id,),
            )
            return [rules.report_from_row(body, seq) for body, seq in rows]

        return self._run(work, begin=None)

    def reported_since(self, scenario: str, cursor: int = 0, limit: int = 1000) -> list[ReportedRecords]:
        def work(cur: Cursor) -> list[ReportedRecords]:
            rows = cur.execute(
                "SELECT body, seq FROM reports WHERE scenario = %s AND seq > %s ORDER BY seq LIMIT %s",
                (scenario, cursor, None if limit < 0 else limit),  # SQLite reads a negative limit as none
            ).fetchall()
            reports = [rules.report_from_row(body, seq) for body, seq in rows]
            refs = sorted({ref for report in reports for ref in report.references})
            live = {r.id: r for r in (rules.record_from_row(b, s) for b, s in _select_records(cur, refs))}
            return [ReportedRecords(rep, tuple(live[ref] for ref in rep.references if ref in live)) for rep in reports]

        return self._run(work, begin=_SNAPSHOT)  # one snapshot for reports and their records

    def count_reports(self, scenario: str | None = None) -> int:
        return self._run(lambda cur: _count(cur, "reports", scenario), begin=None)


def _load_record(cur: Cursor, record_id: str, *, lock: bool = False) -> Record | None:
    query = "SELECT body, seq FROM records WHERE id = %s" + (" FOR UPDATE" if lock else "")
    row = cur.execute(query, (record_id,)).fetchone()
    return rules.record_from_row(*row) if row else None


def _insert_record(cur: Cursor, record: Record, body: str, owner: str | None) -> int | None:
    """The new row's seq, or None if a concurrent writer inserted the id first."""
    now = time.time()
    finished_at = now if record.status is not RecordStatus.IN_PROGRESS else None
    row = cur.execute(
        "INSERT INTO records (id, scenario, session, status, body, created_at, finished_at, owner)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING RETURNING seq",
        (record.id, record.scenario, record.session, record.status.value, body, now, finished_at, owner),
    ).fetchone()
    return int(row[0]) if row else None


def _mark_interrupted(cur: Cursor, owners: Sequence[str] | None) -> int:
    """Mark `incomplete` the records `in_progress` of `owners` (None: of no owner); how many."""
    if owners is None:
        rows = cur.execute(
            "SELECT body, seq FROM records WHERE status = 'in_progress' AND owner IS NULL ORDER BY id FOR UPDATE"
        ).fetchall()
    elif owners:
        rows = cur.execute(
            "SELECT body, seq FROM records WHERE status = 'in_progress' AND owner = ANY(%s) ORDER BY id FOR UPDATE",
            (list(owners),),
        ).fetchall()
    else:
        return 0
    for body, seq in rows:
        stored = rules.record_from_row(body, int(seq))
        _finish(cur, stored, interrupted(stored))
    return len(rows)


def _finish(cur: Cursor, stored: Record, done: Record) -> Record:
    cur.execute(
        "UPDATE records SET status = %s, body = %s, finished_at = %s WHERE id = %s AND status = 'in_progress'",
        (done.status.value, rules.record_body(done), time.time(), stored.id),
    )
    return replace(done, seq=stored.seq)


def _insert_report(cur: Cursor, stamped: Report, body: str) -> Report | None:
    """The stored report, or None if a concurrent writer inserted the id first."""
    row = cur.execute(
        "INSERT INTO reports (id, scenario, body, created_at) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (id) DO NOTHING RETURNING seq",
        (stamped.id, stamped.scenario, body, stamped.created_at),
    ).fetchone()
    if row is None:
        return None
    cur.execute(
        "INSERT INTO report_refs (report_seq, position, record_id)"
        " SELECT %s, ord - 1, ref FROM unnest(%s::text[]) WITH ORDINALITY AS t(ref, ord)",
        (row[0], list(stamped.references)),
    )
    return replace(stamped, seq=int(row[0]))


def _known_ids(cur: Cursor, scenario: str, ids: Sequence[str]) -> set[str]:
    rows = cur.execute(
        "SELECT id FROM records WHERE scenario = %s AND id = ANY(%s)"
        " UNION SELECT id FROM tombstones WHERE scenario = %s AND id = ANY(%s)",
        (scenario, list(ids), scenario, list(ids)),
    )
    return {row[0] for row in rows}


def _select_records(cur: Cursor, ids: list[str]) -> list[tuple[str, int]]:
    if not ids:
        return []
    return cur.execute("SELECT body, seq FROM records WHERE id = ANY(%s)", (ids,)).fetchall()


def _reports_naming(cur: Cursor, record_ids: list[str]) -> dict[str, list[Report]]:
    """The reports that name each record, oldest first."""
    if not record_ids:
        return {}
    return rules.reports_by_record(
        cur.execute(
            "SELECT DISTINCT f.record_id, r.body, r.seq FROM report_refs f JOIN reports r ON r.seq = f.report_seq"
            " WHERE f.record_id = ANY(%s) ORDER BY r.seq",
            (record_ids,),
        )
    )


def _count(cur: Cursor, table: str, scenario: str | None) -> int:
    query = sql.SQL("SELECT COUNT(*) FROM {}").format(sql.Identifier(table))
    if scenario is None:
        row = cur.execute(query).fetchone()
    else:
        row = cur.execute(query + sql.SQL(" WHERE scenario = %s"), (scenario,)).fetchone()
    assert row is not None
    return int(row[0])
