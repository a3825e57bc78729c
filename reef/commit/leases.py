"""Learner leases: one learner per scenario across every front end of a PostgreSQL deployment.

`PgLeases` holds a session-level advisory lock per scenario (`pg_try_advisory_lock`, key: 64
bits of the SHA-256 of `reef:<schema>:learner:<scenario>`) on one connection of its own, opened
with `application_name` = `reef learner <front end>` so that every front end can read who holds
each lease (`pg_locks` joined to `pg_stat_activity`). Only the holder runs the scenario's learner
(`reef.serve.learning.Learning`); the others try again every second.

Why an advisory lock and not a lease row with an expiry: the lock lives exactly as long as the
holder's database session. A front end that dies (crash, SIGKILL, OOM) closes its socket and
PostgreSQL drops the lock at once, so another front end takes the lease on its next try (within
a second), with no clock, expiry or renewal to tune and no row to clean up. A holder cut off
from the database without its socket closing (a lost machine, a partition) is noticed by TCP
keepalives and `tcp_user_timeout` on both sides (about 5 s); the holder itself checks its
connection every second and stops its learner as soon as the check fails. A database restart
ends every session: every lease is free, and the first front end to try after it comes back
takes each one.

A lease is a liveness device, not the safety net: the commit log is. A batch is logged before
any work on it, a batch closes once (publishing or rejecting a batch the log shows closed is a
`Conflict`), a record is in at most one batch (`begin_batch` refuses one already batched), and
every step is a compare-and-swap on the last step, so even two learners that both believed they
held the lease (for the second before one notices it lost its connection) could not train one
batch into two releases or put one sample into two batches.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any, Iterable

import psycopg

from reef.core.errors import StorageUnavailable
from reef.observe.pg_connections import close_quietly

APPLICATION_PREFIX = "reef learner "
_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 5000,
}  # the client side notices a silent server within ~5 s
_SERVER_SIDE = (
    "SET tcp_keepalives_idle = 2",
    "SET tcp_keepalives_interval = 1",
    "SET tcp_keepalives_count = 3",
    "SET tcp_user_timeout = 5000",
)  # and PostgreSQL drops a silent holder (and its locks) likewise


def lease_key(schema: str, scenario: str) -> int:
    """The advisory-lock key of a scenario's learner lease (a signed 64-bit integer)."""
    digest = hashlib.sha256(f"reef:{schema}:learner:{scenario}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PgLeases:
    """The learner leases of one front end. Thread-safe; every call is one short round trip."""

    kind = "postgresql advisory lock"

    def __init__(self, dsn: str, schema: str, holder: str, *, connect_timeout: int = 5) -> None:
        self.dsn = dsn
        self.schema = schema
        self.holder = holder  # this front end, as the others see it
        self.connect_timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._held: set[str] = set()
        self._lock = threading.Lock()

    def keep(self) -> set[str]:
        """Check the lease connection: the scenarios whose lease this front end still holds
        (none once the connection is lost: PostgreSQL released them)."""
        with self._lock:
            if self._conn is None:
                return set()
            try:
                self._conn.execute("SELECT 1")
            except psycopg.Error:
                self._drop()
            return set(self._held)

    def try_take(self, scenario: str) -> bool:
        """Take the scenario's lease if no front end holds it; True if this one holds it now."""
        with self._lock:
            if scenario in self._held:
                return True
            try:
                conn = self._connection()
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (lease_key(self.schema, scenario),)).fetchone()
            except psycopg.Error as exc:
                self._drop()
                raise StorageUnavailable(f"cannot take the learner lease of {scenario!r}: {exc}") from exc
            if row and row[0]:
                self._held.add(scenario)
                return True
            return False

    def release(self, scenario: str) -> None:
        with self._lock:
            if scenario not in self._held:
                return
            self._held.discard(scenario)
            try:
                assert self._conn is not None
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (lease_key(self.schema, scenario),))
            except psycopg.Error:
                self._drop()  # the session ends: PostgreSQL releases every lease it held

    def holders(self, scenarios: Iterable[str]) -> dict[str, str | None]:
        """Who holds each scenario's lease (a front end's name), or None where nobody does."""
        wanted = {lease_key(self.schema, s): s for s in scenarios}
        out: dict[str, str | None] = dict.fromkeys(wanted.values())
        if not wanted:
            return out
        with self._lock:
            try:
                rows = (
                    self._connection()
                    .execute(
                        "SELECT l.classid, l.objid, a.application_name FROM pg_locks l"
                        " JOIN pg_stat_activity a ON a.pid = l.pid"
                        " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
                        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                    )
                    .fetchall()
                )
            except psycopg.Error as exc:
                self._drop()
                raise StorageUnavailable(f"cannot read the learner leases: {exc}") from exc
        for classid, objid, application in rows:
            key = (int(classid) << 32) | int(objid)
            key = key - (1 << 64) if key >= 1 << 63 else key
            if key in wanted:
                name = application or ""
                out[wanted[key]] = name[len(APPLICATION_PREFIX) :] if name.startswith(APPLICATION_PREFIX) else name
        return out

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        self._drop()
        conn: psycopg.Connection[Any] = psycopg.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=self.connect_timeout,
            application_name=(APPLICATION_PREFIX + self.holder)[:63],
            **_KEEPALIVES,
        )
        try:
            for statement in _SERVER_SIDE:
                conn.execute(statement)
        except psycopg.Error:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _drop(self) -> None:
        self._held.clear()
        conn, self._conn = self._conn, None
        close_quietly(conn)
