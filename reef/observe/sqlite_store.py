"""The SQLite experience store: WAL, `synchronous=FULL`, one writer thread with group commit.

Every write is a small function run by a single writer thread on its own connection. The
writer takes whatever writes are queued (up to `max_batch`), runs each inside its own
savepoint in one `BEGIN IMMEDIATE` transaction, commits once (one fsync for the group) and only
then answers each caller. A caller's write is durable when its call returns; a failing write
rolls back its own savepoint and leaves the rest of the group intact. Readers use one
connection per thread and never block the writer (WAL).

Several processes may share the file (the workers of `reef serve --workers N` on one state
directory): SQLite's file locks make their writers take turns, each `BEGIN IMMEDIATE` waiting up
to `BUSY_TIMEOUT_S` for another process's transaction instead of failing with SQLITE_BUSY, and
each process's readers see what the others committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

from reef.core.canonical import check_id
from reef.core.errors import NotFound, RecordConflict, ReefError, StorageUnavailable
from reef.core.types import Record, RecordStatus, Report, ReportedRecords
from reef.observe import rules
from reef.observe.instances import FileInstances, interrupted
from reef.observe.record_query import RecordPage, RecordQuery
from reef.observe.store import ExperienceStore

T = TypeVar("T")
Write = Callable[[sqlite3.Connection], Any]

SCHEMA_VERSION = 2
BUSY_TIMEOUT_S = 30.0  # a write waits this long for another process's transaction (SQLITE_BUSY)
SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    scenario TEXT NOT NULL,
    session TEXT,
    status TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS records_by_scenario ON records (scenario, seq);
CREATE INDEX IF NOT EXISTS records_by_session ON records (scenario, session, seq);
CREATE TABLE IF NOT EXISTS tombstones (
    id TEXT PRIMARY KEY,
    scenario TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    compacted_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    scenario TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS reports_by_scenario ON reports (scenario, seq);
CREATE TABLE IF NOT EXISTS report_refs (
    report_seq INTEGER NOT NULL,
    position INTEGER NOT NULL,
    record_id TEXT NOT NULL,
    PRIMARY KEY (report_seq, position)
);
CREATE INDEX IF NOT EXISTS report_refs_by_record ON report_refs (record_id);
-- a compacted id is never inserted again; the caller sees rowcount 0 and checks the tombstone
CREATE TRIGGER IF NOT EXISTS records_not_resurrected BEFORE INSERT ON records
WHEN EXISTS (SELECT 1 FROM tombstones WHERE id = NEW.id)
BEGIN SELECT RAISE(IGNORE); END;
"""
# Version 2: each record `in_progress` names the store instance that may finish it (instances.py).
TRACK_OWNERS = """
ALTER TABLE records ADD COLUMN owner TEXT;
CREATE INDEX IF NOT EXISTS records_in_progress ON records (owner) WHERE status = 'in_progress';
"""
log = logging.getLogger("reef.store")

_STOP = object()


class SQLiteStore(ExperienceStore):
    def __init__(self, path: Path | str, *, max_batch: int = 256) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()  # cheaper wake-ups than Queue
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._writer_failure: BaseException | None = None
        self._writer_conn = self._connect()
        self._migrate(self._writer_conn)
        self.instances = FileInstances(self.path)
        self._writer = threading.Thread(target=self._write_loop, name="reef-sqlite-writer", daemon=True)
        self._writer.start()
        self._close_interrupted()

    # -- connections ---------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S)
        _use_wal(conn)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StorageUnavailable(
                f"{self.path}: schema version {version} is newer than this Reef ({SCHEMA_VERSION})"
            )
        if version == SCHEMA_VERSION:
            return  # opening a current store writes nothing, so it opens on a full disk too
        try:
            conn.execute("BEGIN IMMEDIATE")  # one migrator at a time (workers open one new store at once)
            try:
                _upgrade(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"{self.path}: cannot create the store's tables: {exc}") from exc

    def _close_interrupted(self) -> None:
        """Mark `incomplete` the records that store instances now gone left `in_progress`
        (instances.py); a failure (a full disk) leaves them for the next open."""
        try:
            owners = [
                row[0]
                for row in self._reader().execute("SELECT DISTINCT owner FROM records WHERE status = 'in_progress'")
            ]
            gone = [owner for owner in owners if not self.instances.alive(owner)]
            if gone:
                marked = self._submit(lambda conn: _mark_interrupted(conn, gone))
                log.warning(
                    "%s: %d record(s) left in progress by a stopped server marked incomplete", self.path, marked
                )
            self.instances.sweep()
        except (ReefError, sqlite3.Error, OSError) as exc:
            log.warning("%s: records left in progress by a stopped server could not be closed now: %s", self.path, exc)

    def _reader(self) -> sqlite3.Connection:
        if self._closed:
            raise StorageUnavailable(f"{self.path}: store is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only=ON")
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._writer.join()
        self._writer_conn.close()
        self.instances.close()
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()

    # -- the writer ----------------------------------------------------------------------

    def _submit(self, write: Write, *, single_statement: bool = False) -> Any:
        """Run `write` in the writer's next group; return once it is durable. A write that
        changes at most one row in one statement needs no savepoint of its own (SQLite undoes
        a failed statement by itself), which saves the writer two round trips."""
        return self._enqueue(write, single_statement).result()

    async def _submit_async(self, write: Write, *, single_statement: bool = False) -> Any:
        """`_submit` for the event loop: the caller awaits instead of blocking a thread."""
        return await asyncio.wrap_future(self._enqueue(write, single_statement))

    def _enqueue(self, write: Write, single_statement: bool) -> Future[Any]:
        if self._closed:
            raise StorageUnavailable(f"{self.path}: store is closed")
        if (problem := self.health()) is not None:  # never queue a write nobody will run
            raise StorageUnavailable(problem)
        future: Future[Any] = Future()
        self._queue.put((write, future, single_statement))
        return future

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            group = [item]
            while len(group) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._queue.put(_STOP)
                    break
                group.append(nxt)
            try:
                self._run_group(group)
            except BaseException as exc:  # noqa: BLE001 - one caller's failure never stops the writer
                self._writer_failure = exc
                for _, future, _ in group:
                    _answer(future, False, StorageUnavailable(f"{self.path}: write failed: {exc!r}"))

    def _run_group(self, group: list[tuple[Write, Future[Any], bool]]) -> None:
        """One transaction for the group. A write that fails is undone alone (its savepoint, or
        SQLite's own statement rollback) and fails only its caller; only an error that ends the
        transaction (a full disk, an I/O error) fails the whole group."""
        conn = self._writer_conn
        live = [item for item in group if item[1].set_running_or_notify_cancel()]  # a cancelled caller is gone
        outcomes: list[tuple[bool, Any]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for write, _, single_statement in live:
                outcomes.append(_run_one(conn, write, single_statement))
            conn.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 - the writer thread must outlive any failure
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # a failed ROLLBACK must not kill the writer
                    conn.execute("ROLLBACK")
            error = StorageUnavailable(f"{self.path}: write failed: {exc}")
            for _, future, _ in live:
                _answer(future, False, error)
            return
        for (ok, value), (_, future, _) in zip(outcomes, live):
            _answer(future, ok, value)

    def health(self) -> str | None:
        if self._writer.is_alive() or self._closed:
            return None
        return f"{self.path}: the writer thread has stopped ({self._writer_failure!r})"

    # -- records -------------------------------------------------------------------------

    def put_record(self, record: Record) -> Record:
        return self._submit(self._put_record_write(record), single_statement=True)

    async def aput_record(self, record: Record) -> Record:
        return await self._submit_async(self._put_record_write(record), single_statement=True)

    def _put_record_write(self, record: Record) -> Write:
        body = rules.record_body(record)  # serialised here, while the writer may be in fsync
        finished_at, owner = self._lifecycle(record)

        def write(conn: sqlite3.Connection) -> Record:
            cur = conn.execute(
                "INSERT INTO records (id, scenario, session, status, body, created_at, finished_at, owner)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (
                    record.id,
                    record.scenario,
                    record.session,
                    record.status.value,
                    body,
                    time.time(),
                    finished_at,
                    owner,
                ),
            )
            if cur.rowcount == 1:
                return replace(record, seq=cur.lastrowid)
            stored = _load_record(conn, record.id)
            if stored is None:  # compacted: the trigger refused to resurrect it
                tomb = conn.execute("SELECT content_hash FROM tombstones WHERE id = ?", (record.id,)).fetchone()
                if tomb[0] != rules.record_content_hash(record):
                    raise RecordConflict(f"record {record.id} already existed with other content (compacted)")
                return record
            resolved, must_finish = rules.resolve_record_retry(stored, record)
            return _finish(conn, stored, resolved) if must_finish else resolved

        return write

    def _lifecycle(self, record: Record) -> tuple[float | None, str | None]:
        """A new row's `finished_at` and `owner`: a record `in_progress` is this instance's to finish."""
        if record.status is RecordStatus.IN_PROGRESS:
            return None, self.instances.id
        return time.time(), None

    def replace_incomplete(self, record: Record) -> Record:
        body = rules.record_body(record)
        finished_at, owner = self._lifecycle(record)

        def write(conn: sqlite3.Connection) -> Record:
            stored = _load_record(conn, record.id)
            if stored is None:
                raise NotFound(f"unknown record {record.id}")
            reported = conn.execute("SELECT 1 FROM report_refs WHERE record_id = ? LIMIT 1", (record.id,)).fetchone()
            rules.check_replaceable(stored, record, reported=reported is not None)
            conn.execute(
                "UPDATE records SET status = ?, body = ?, created_at = ?, finished_at = ?, owner = ? WHERE id = ?",
                (record.status.value, body, time.time(), finished_at, owner, record.id),
            )
            return replace(record, seq=stored.seq)

        return self._submit(write, single_statement=True)

    def _finish_record(self, record_id: str, outcome: rules.Outcome) -> Record:
        return self._submit(self._finish_write(record_id, outcome), single_statement=True)

    async def _afinish_record(self, record_id: str, outcome: rules.Outcome) -> Record:
        return await self._submit_async(self._finish_write(record_id, outcome), single_statement=True)

    def _finish_write(self, record_id: str, outcome: rules.Outcome) -> Write:
        def write(conn: sqlite3.Connection) -> Record:
            stored = _load_record(conn, record_id)
            if stored is None:
                raise NotFound(f"unknown record {record_id}")
            done = rules.finished(stored, outcome)
            return stored if done is None else _finish(conn, stored, done)

        return write

    def get_record(self, record_id: str) -> Record:
        stored = _load_record(self._reader(), record_id)
        if stored is None:
            raise NotFound(f"unknown record {record_id}")
        return stored

    def session_records(self, scenario: str, session: str) -> list[Record]:
        rows = self._reader().execute(
            "SELECT body, seq FROM records WHERE scenario = ? AND session = ? ORDER BY seq", (scenario, session)
        )
        return [rules.record_from_row(body, seq) for body, seq in rows]

    def _records_page(self, query: RecordQuery, cursor: int) -> RecordPage:
        conn = self._reader()
        conn.execute("BEGIN")  # one snapshot for a page and its reports; none held between pages
        try:
            rows = conn.execute(query.select("?"), query.params(cursor)).fetchall()
            return query.page(rows, cursor, lambda ids: _reports_naming(conn, ids))
        finally:
            conn.execute("COMMIT")

    def compact(self, scenario: str, record_ids: Sequence[str]) -> int:
        def write(conn: sqlite3.Connection) -> int:
            deleted = 0
            now = time.time()
            for record_id in record_ids:
                stored = _load_record(conn, record_id)
                if stored is None or stored.scenario != scenario:
                    continue
                conn.execute(
                    "INSERT OR IGNORE INTO tombstones (id, scenario, content_hash, compacted_at) VALUES (?, ?, ?, ?)",
                    (record_id, scenario, rules.record_content_hash(stored), now),
                )
                conn.execute("DELETE FROM records WHERE id = ?", (record_id,))
                deleted += 1
            return deleted

        return self._submit(write)

    def stitch_session(self, record_id: str, session: str) -> bool:
        check_id(session, "session")
        sql_ = "UPDATE records SET session = ? WHERE id = ? AND session IS NULL"
        return self._submit(lambda conn: conn.execute(sql_, (session, record_id)).rowcount == 1)

    def archive_scenario(self, scenario: str, archived_as: str) -> int:
        def write(conn: sqlite3.Connection) -> int:
            for table in ("reports", "tombstones"):
                conn.execute(f"UPDATE {table} SET scenario = ? WHERE scenario = ?", (archived_as, scenario))
            return conn.execute("UPDATE records SET scenario = ? WHERE scenario = ?", (archived_as, scenario)).rowcount

        return self._submit(write)

    def count_records(self, scenario: str | None = None) -> int:
        return _count(self._reader(), "records", scenario)

    # -- reports -------------------------------------------------------------------------

    def put_report(self, report: Report) -> Report:
        return self._submit(self._report_write(report))

    async def aput_report(self, report: Report) -> Report:
        return await self._submit_async(self._report_write(report))

    def _report_write(self, report: Report) -> Write:
        report = rules.with_distinct_references(report)
        stamped = replace(report, created_at=time.time())
        body = rules.report_body(stamped)  # serialised here, while the writer may be in fsync

        def write(conn: sqlite3.Connection) -> Report:
            row = conn.execute("SELECT body, seq FROM reports WHERE id = ?", (report.id,)).fetchone()
            if row is not None:
                return rules.check_report_retry(rules.report_from_row(*row), report)
            rules.require_references(report, _known_ids(conn, report.scenario, report.references))
            cur = conn.execute(
                "INSERT INTO reports (id, scenario, body, created_at) VALUES (?, ?, ?, ?)",
                (report.id, report.scenario, body, stamped.created_at),
            )
            conn.executemany(
                "INSERT INTO report_refs (report_seq, position, record_id) VALUES (?, ?, ?)",
                [(cur.lastrowid, i, ref) for i, ref in enumerate(report.references)],
            )
            return replace(stamped, seq=cur.lastrowid)

        return write

    def put_batch(self, items: Sequence[rules.BatchItem]) -> list[rules.BatchItem]:
        def write(conn: sqlite3.Connection) -> list[rules.BatchItem]:  # one savepoint: all or none
            return rules.store_batch(
                items, lambda r: self._put_record_write(r)(conn), lambda p: self._report_write(p)(conn)
            )

        return self._submit(write)

    def get_report(self, report_id: str) -> Report:
        row = self._reader().execute("SELECT body, seq FROM reports WHERE id = ?", (report_id,)).fetchone()
        if row is None:
            raise NotFound(f"unknown report {report_id}")
        return rules.report_from_row(*row)

    def reports_for(self, record_id: str) -> list[Report]:
        rows = self._reader().execute(
            "SELECT DISTINCT r.body, r.seq FROM reports r JOIN report_refs f ON f.report_seq = r.seq"
            " WHERE f.record_id = ? ORDER BY r.seq",
            (record_id,),
        )
        return [rules.report_from_row(body, seq) for body, seq in rows]

    def reported_since(self, scenario: str, cursor: int = 0, limit: int = 1000) -> list[ReportedRecords]:
        conn = self._reader()
        conn.execute("BEGIN")  # one snapshot for reports and their records
        try:
            reports = [
                rules.report_from_row(body, seq)
                for body, seq in conn.execute(
                    "SELECT body, seq FROM reports WHERE scenario = ? AND seq > ? ORDER BY seq LIMIT ?",
                    (scenario, cursor, limit),
                )
            ]
            out = []
            for report in reports:
                records = [r for r in (_load_record(conn, ref) for ref in report.references) if r is not None]
                out.append(ReportedRecords(report, tuple(records)))
            return out
        finally:
            conn.execute("COMMIT")

    def count_reports(self, scenario: str | None = None) -> int:
        return _count(self._reader(), "reports", scenario)


# Errors after which SQLite may have rolled the whole transaction back (primary result codes).
_TRANSACTION_FATAL = {7, 8, 10, 11, 13, 14, 26}  # NOMEM, READONLY, IOERR, CORRUPT, FULL, CANTOPEN, NOTADB


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL (a no-op once it is). Switching a new file takes a lock SQLite
    does not wait for (no busy handler), so processes opening one new store at once (the
    workers of a shared state directory) retry it within the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _run_one(conn: sqlite3.Connection, write: Write, single_statement: bool) -> tuple[bool, Any]:
    """Run one caller's write: (True, result) or (False, its error). A write that changes at
    most one row in one statement needs no savepoint (SQLite undoes a failed statement itself)."""
    if not single_statement:
        conn.execute("SAVEPOINT one")
    try:
        result = write(conn)
    except Exception as exc:  # noqa: BLE001 - the caller gets its own error
        if isinstance(exc, sqlite3.Error) and (_ends_transaction(exc) or not conn.in_transaction):
            raise
        if not single_statement:
            conn.execute("ROLLBACK TO one")
            conn.execute("RELEASE one")
        if isinstance(exc, sqlite3.Error):
            return False, StorageUnavailable(f"write failed: {exc}")
        return False, exc
    if not single_statement:
        conn.execute("RELEASE one")
    return True, result


def _ends_transaction(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is None or (code & 0xFF) in _TRANSACTION_FATAL


def _answer(future: Future[Any], ok: bool, value: Any) -> None:
    """Hand a caller its outcome; a caller that was cancelled meanwhile is simply gone."""
    with contextlib.suppress(InvalidStateError):
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


def _load_record(conn: sqlite3.Connection, record_id: str) -> Record | None:
    row = conn.execute("SELECT body, seq FROM records WHERE id = ?", (record_id,)).fetchone()
    return rules.record_from_row(*row) if row else None


def _upgrade(conn: sqlite3.Connection) -> None:
    """Bring the schema to `SCHEMA_VERSION`, inside the caller's transaction. The records a Reef
    before version 2 left `in_progress` name no instance: their writers are the processes this
    upgrade replaces, so they are marked `incomplete` with it."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]  # again, under the write lock
    if version < 1:
        for statement in _statements(SCHEMA):
            conn.execute(statement)
    if version < 2:
        for statement in _statements(TRACK_OWNERS):
            conn.execute(statement)
        _mark_interrupted(conn, None)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def _statements(script: str) -> Iterator[str]:
    """The statements of a script one by one (`executescript` would commit the transaction)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending
            pending = ""


def _mark_interrupted(conn: sqlite3.Connection, owners: Sequence[str] | None) -> int:
    """Mark `incomplete` the records `in_progress` of `owners` (None: of no owner); how many."""
    query = "SELECT body, seq FROM records WHERE status = 'in_progress' AND owner IS ?"  # IS: NULL matches NULL
    rows = [
        row for owner in (owners if owners is not None else [None]) for row in conn.execute(query, (owner,)).fetchall()
    ]
    for body, seq in rows:
        stored = rules.record_from_row(body, seq)
        _finish(conn, stored, interrupted(stored))
    return len(rows)


def _finish(conn: sqlite3.Connection, stored: Record, done: Record) -> Record:
    conn.execute(
        "UPDATE records SET status = ?, body = ?, finished_at = ? WHERE id = ? AND status = 'in_progress'",
        (done.status.value, rules.record_body(done), time.time(), stored.id),
    )
    return replace(done, seq=stored.seq)


_IDS_PER_QUERY = 500  # well under SQLite's limit on bound variables (32,766; 999 before 3.32)


def _known_ids(conn: sqlite3.Connection, scenario: str, ids: Sequence[str]) -> set[str]:
    known: set[str] = set()
    unique = sorted(set(ids))
    for start in range(0, len(unique), _IDS_PER_QUERY):
        chunk = unique[start : start + _IDS_PER_QUERY]
        marks = ",".join("?" * len(chunk))
        for table in ("records", "tombstones"):
            rows = conn.execute(f"SELECT id FROM {table} WHERE scenario = ? AND id IN ({marks})", (scenario, *chunk))
            known.update(row[0] for row in rows)
    return known


def _reports_naming(conn: sqlite3.Connection, record_ids: Sequence[str]) -> dict[str, list[Report]]:
    """The reports that name each record, oldest first."""

    def rows() -> Iterator[tuple[str, str, int]]:
        for start in range(0, len(record_ids), _IDS_PER_QUERY):
            chunk = list(record_ids[start : start + _IDS_PER_QUERY])
            yield from conn.execute(
                "SELECT DISTINCT f.record_id, r.body, r.seq FROM report_refs f JOIN reports r ON r.seq = f.report_seq"
                f" WHERE f.record_id IN ({','.join('?' * len(chunk))}) ORDER BY r.seq",
                chunk,
            )

    return rules.reports_by_record(rows())


def _count(conn: sqlite3.Connection, table: str, scenario: str | None) -> int:
    if scenario is None:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    return conn.execute(f"SELECT COUNT(*) FROM {table} WHERE scenario = ?", (scenario,)).fetchone()[0]
