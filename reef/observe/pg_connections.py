"""PostgreSQL connections as the experience store, the commit log and the learner leases use them.

`connect` opens a connection on Reef's schema whose commits are durable when they return;
`ConnectionPool` keeps a few; `run_with_retries` runs work in one transaction on a pooled one.
One retry rule serves every caller (`retrying`): a pooled connection found dead before anything
was written is replaced (the idle ones, likely dead too, are dropped), and a deadlock or a
serialization failure is tried again, up to `ATTEMPTS` tries in all. `describe` names where a
database lives for error messages, never with the password.
"""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from reef.core.errors import InvalidInput, StorageUnavailable

T = TypeVar("T")
Cursor = psycopg.Cursor[Any]
Connection = psycopg.Connection[Any]

ATTEMPTS = 3  # a dead pooled connection, a deadlock or a lost insert race is tried this many times


class DeadConnection(Exception):
    """A pooled connection was found dead before any write reached the server: retry the work
    (raised from the psycopg error)."""


def connect(dsn: str, schema: str, *settings: str) -> Connection:
    """An autocommit connection on `schema` (its search path) with durable commits whatever the
    server's default, and `settings` (SET statements) after that."""
    conn: Connection = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    try:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute("SET synchronous_commit TO on")
        for statement in settings:
            conn.execute(statement)
    except BaseException:
        conn.close()
        raise
    return conn


class ConnectionPool:
    """At most `size` connections, created on demand, reused last-in first-out."""

    def __init__(self, connect: Callable[[], Connection], size: int, *, timeout: float = 30.0) -> None:
        if size < 1:
            raise InvalidInput("pool_size must be at least 1")
        self._connect = connect
        self._timeout = timeout
        self._idle: queue.LifoQueue[Connection] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self.closed = False

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        if self.closed:
            raise StorageUnavailable("postgres store is closed")
        if not self._slots.acquire(timeout=self._timeout):
            raise StorageUnavailable(f"no free postgres connection after {self._timeout:.0f} s")
        conn: Connection | None = None
        try:
            conn = self._take()
            yield conn
        finally:
            if conn is not None:
                self._give_back(conn)
            self._slots.release()

    def _take(self) -> Connection:
        while True:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                return self._connect()
            if not conn.closed:
                return conn

    def _give_back(self, conn: Connection) -> None:
        healthy = not conn.closed and not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE
        if healthy and not self.closed:
            self._idle.put(conn)
        else:
            conn.close()

    def discard_idle(self) -> None:
        """Close every idle connection (after one was found dead, the rest likely are)."""
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    def close(self) -> None:
        self.closed = True
        self.discard_idle()


def retrying(pool: ConnectionPool, where: str, attempt: Callable[[], T]) -> T:
    """`attempt()`, tried again while it raises `DeadConnection` (the pool's idle connections
    dropped first) or ends in a deadlock or serialization failure, `ATTEMPTS` tries in all; the
    last one's failure is StorageUnavailable. Any other error is the caller's to shape."""
    for tried in range(1, ATTEMPTS + 1):
        try:
            return attempt()
        except DeadConnection as exc:
            pool.discard_idle()
            if tried == ATTEMPTS:
                raise StorageUnavailable(f"{where}: {exc.__cause__}") from exc.__cause__
        except psycopg.errors.TransactionRollback as exc:  # deadlock or serialization failure
            if tried == ATTEMPTS:
                raise StorageUnavailable(f"{where}: write kept failing: {exc}") from exc
    raise AssertionError("unreachable")


def run_with_retries(pool: ConnectionPool, where: str, work: Callable[[Cursor], T], begin: str | None) -> T:
    """`work` on a pooled connection (`begin`: in one transaction, else one autocommitted
    statement), committed, under the retry rule (`retrying`). Every other failure is
    StorageUnavailable."""

    def attempt() -> T:
        try:
            with pool.connection() as conn:
                return _in_transaction(conn, begin, work)
        except psycopg.errors.TransactionRollback:
            raise
        except psycopg.Error as exc:
            raise StorageUnavailable(f"{where}: {type(exc).__name__}: {exc}") from exc

    return retrying(pool, where, attempt)


def _in_transaction(conn: Connection, begin: str | None, work: Callable[[Cursor], T]) -> T:
    with conn.cursor() as cur:
        try:
            if begin is None:
                return work(cur)  # a read: safe to retry whatever happened
            cur.execute(begin)
        except psycopg.OperationalError as exc:
            if conn.broken:
                raise DeadConnection() from exc
            raise
        try:
            result = work(cur)
        except BaseException:
            rollback_quietly(conn)
            raise
        cur.execute("COMMIT")
        return result


def rollback_quietly(conn: Connection) -> None:
    """Roll back the open transaction; a connection that cannot is closed (a pool drops it)."""
    try:
        conn.rollback()
    except psycopg.Error:
        conn.close()


def close_quietly(conn: Connection | None) -> None:
    if conn is not None:
        try:
            conn.close()
        except psycopg.Error:
            pass


def migrate(cur: Cursor, schema: str, where: str, tables: str, current: int, upgrade: Callable[[int], None]) -> None:
    """Bring one set of Reef's tables in `schema` (the experience store's, the commit log's) to
    version `current`, kept in the schema's `meta` table under `<tables>_version`: `upgrade`
    runs the DDL from the version found (0: none yet). One migrator per schema at a time, whichever
    tables (concurrent CREATE ... IF NOT EXISTS can still collide); a schema already current gets
    no DDL, so a role without CREATE rights can open a prepared one."""
    cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"reef:{schema}:migrate",))
    key = f"{tables.replace(' ', '_')}_version"
    version = _meta_version(cur, schema, key)
    if version > current:
        raise StorageUnavailable(f"{where}: {tables} version {version} is newer than this Reef ({current})")
    if version == current:
        return
    cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    cur.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    upgrade(version)
    cur.execute(
        "INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        (key, str(current)),
    )


def _meta_version(cur: Cursor, schema: str, key: str) -> int:
    """The version in `meta` under `key`; 0 when the schema or its meta table does not exist yet."""
    if cur.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, "meta").as_string(cur),)).fetchone() == (None,):
        return 0
    row = cur.execute("SELECT value FROM meta WHERE key = %s", (key,)).fetchone()
    return int(row[0]) if row else 0


def describe(dsn: str, schema: str) -> str:
    """Where the database lives, for error messages (never the password)."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.Error:
        return f"postgres store (schema {schema})"
    host, port, db = info.get("host", "localhost"), info.get("port", "5432"), info.get("dbname", "")
    return f"postgresql://{host}:{port}/{db} (schema {schema})"
