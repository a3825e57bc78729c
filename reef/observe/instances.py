"""Which open stores are alive, so that records a dead process left `in_progress` get closed.

A record `in_progress` is finished only by the process that wrote it, and that may be another
process serving the same store (the workers of `reef serve --workers N` on one SQLite file,
front ends sharing one PostgreSQL database). So each open store is an instance with its own
random id: it stamps that id on every record it writes `in_progress` and holds, while it lives,
a lock that the operating system or the database releases the moment its process ends, SIGKILL
included (SQLite: an `flock` on `<store>.instances/<id>.lock`; PostgreSQL: a session advisory
lock on a connection of its own). An instance whose lock can be taken is gone and can never
finish its records, so recovery marks them `incomplete` (`INTERRUPTED`); the records of a live
instance are never touched, however old.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from reef.core.canonical import new_id
from reef.core.types import Record, RecordStatus

if TYPE_CHECKING:  # psycopg is imported only with a PostgreSQL store
    import psycopg

INTERRUPTED = "the server stopped before the answer finished"
KEEP_ALIVE_S = 1.0  # how often a PostgreSQL instance checks that its lock's connection still lives
_INSTANCE_ID = re.compile(r"[0-9a-f]{32}")
log = logging.getLogger("reef.store")


def interrupted(stored: Record) -> Record:
    """The `incomplete` form of a record whose writer is gone, with whatever it had."""
    return replace(stored, status=RecordStatus.INCOMPLETE, error=INTERRUPTED)


class FileInstances:
    """The instances of a SQLite store: `<store>.instances/<id>.lock`, each `flock`ed by its
    live instance. A file whose lock can be taken, or a missing one, is an instance that is gone."""

    def __init__(self, store_path: Path) -> None:
        self.dir = store_path.with_name(store_path.name + ".instances")
        self.dir.mkdir(exist_ok=True)
        self.id = new_id()
        self._fd = self._register()

    def _register(self) -> int:
        """Lock a file under a temporary name, then give it its name: no other process ever
        sees this instance's file unlocked (and takes it for a dead one)."""
        staging = self.dir / f".{self.id}.new"
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(staging, self._path(self.id))
        except BaseException:
            os.close(fd)
            staging.unlink(missing_ok=True)
            raise
        return fd

    def _path(self, instance: str) -> Path:
        return self.dir / f"{instance}.lock"

    def alive(self, instance: str | None) -> bool:
        """Whether `instance` may still finish its records. An id that is not one of ours
        (a record written before instances were tracked) is treated as alive: never guessed at."""
        if instance is None or not _INSTANCE_ID.fullmatch(instance):
            return True
        if instance == self.id:
            return True
        try:
            fd = os.open(self._path(instance), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing it lets go of the lock just taken
        return False

    def sweep(self) -> None:
        """Remove the files of instances that are gone (their records were closed first)."""
        for path in self.dir.glob("*.lock"):
            if not self.alive(path.stem):
                path.unlink(missing_ok=True)

    def close(self) -> None:
        if self._fd < 0:
            return
        self._path(self.id).unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


class PgInstances:
    """The instances of a PostgreSQL store: each holds a session advisory lock keyed by its id on
    a connection of its own. A thread checks that connection every `KEEP_ALIVE_S` and takes the
    lock again on a new one if it died (a database restart): until then, this instance would look
    gone to a front end opening the store at that very moment."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], schema: str) -> None:
        self.id = new_id()
        self._schema = schema
        self._connect = connect
        self._conn = self._hold()
        self._stop = threading.Event()
        self._keeper = threading.Thread(target=self._keep, name="reef-store-instance", daemon=True)
        self._keeper.start()

    def key(self, instance: str) -> str:
        return f"reef:{self._schema}:instance:{instance}"

    def _hold(self) -> psycopg.Connection[Any]:
        conn = self._connect()
        try:
            conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (self.key(self.id),))
        except BaseException:
            conn.close()
            raise
        return conn

    def _keep(self) -> None:
        import psycopg

        while not self._stop.wait(KEEP_ALIVE_S):
            try:
                self._conn.execute("SELECT 1")
            except psycopg.Error:
                self._conn.close()
                try:
                    self._conn = self._hold()
                    log.warning("store instance %s: its lock's connection died; lock taken again", self.id)
                except psycopg.Error:
                    pass  # the database is still away: try again next round

    def alive(self, instance: str | None, cur: psycopg.Cursor[Any]) -> bool:
        """Whether `instance` may still finish its records; taking its lock (held by `cur`'s
        transaction until it ends) means its process is gone."""
        if instance is None or not _INSTANCE_ID.fullmatch(instance) or instance == self.id:
            return True
        row = cur.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", (self.key(instance),)).fetchone()
        return not (row and row[0])

    def close(self) -> None:
        self._stop.set()
        self._keeper.join()
        self._conn.close()
