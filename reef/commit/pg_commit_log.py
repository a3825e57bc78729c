"""The commit log in PostgreSQL: every front end on one database shares each scenario's steps.

Used when the experience store is PostgreSQL (`ReefState.open` picks it through
`reef.commit.state.commit_logs_for`), in the store's schema, beside its tables:

    commit_log   (scenario, step, operation, body, recorded_at)   PRIMARY KEY (scenario, step)
        one row per step, append-only: a trigger refuses UPDATE, DELETE and TRUNCATE. `body`
        is the step's canonical JSON (`CommitEntry.to_json`), the very line the JSONL log holds.
    commit_heads (scenario PRIMARY KEY, last_step)
        one row per scenario: the row every writer locks, and the number of its last step.

Compare-and-swap: a row lock and a conditional update, in READ COMMITTED. `transaction()`
(which `append` also uses) begins a transaction and locks the scenario's `commit_heads` row
(`SELECT ... FOR UPDATE`; the first writer of a scenario inserts it). While it is held, no other
front end can write the scenario: the release chain checks the head, commits the artifact and
appends, as under the JSONL log's `flock`. Every statement after the lock sees all that was
committed before it (READ COMMITTED takes a snapshot per statement), so the head it checks is
the latest. `append` then inserts the step and moves `commit_heads.last_step` from the
expected step to the new one (`UPDATE ... WHERE last_step = expected`), and commits before it
returns: the COMMIT (with `synchronous_commit=on`) is the commit point, as the fsync is for a
file. The (scenario, step) primary key refuses a second row for a step whatever happens, so
even a writer that bypassed the lock could not fork the chain.

Why not SERIALIZABLE: the critical section spans work outside the database (the git commit of
the artifact), which a serialization failure at COMMIT could not undo; the loser would have
to retry everything to learn that the head moved, and two creations of one scenario (the
first request on two front ends at once) would abort rather than one waiting and finding the
other's. With the row lock the loser waits, then reads the new head and gets `StaleHead` (or,
for a creation, the existing scenario) before it writes anything. Why not the unique key
alone: two front ends would both commit artifacts and race to the insert; the key stays as
the last line of defence, the lock makes the race orderly.

A transaction's connection holds the lock until the transaction ends (the end is a ROLLBACK:
each append committed already, and re-locks lazily if the transaction goes on). A front end
that dies loses its connection and PostgreSQL releases the lock; a wait longer than
`LOCK_TIMEOUT_MS`, or a holder idle longer than `IDLE_TIMEOUT_MS`, ends in an error instead of
a hang. Recovery reads every scenario's rows in one snapshot and checks them: steps 1, 2, 3...
without a gap, each row's body parses and names its own scenario and step, the first is a
creation, and `commit_heads` agrees; any other damage is `Corruption` naming the database,
schema, scenario and step.

Following the head: `append` also sends `NOTIFY reef_commit_log, '<schema>\t<scenario>\t<step>'`
inside its transaction, so PostgreSQL delivers it when (and only if) the step commits.
`PgCommitLogs.watch()` LISTENs on a connection of its own and wakes a front end's follower
(`reef.serve.scenarios.HeadFollower`), which reads `heads()` (one query: every scenario's last
step) and serves what moved; the follower also reads `heads()` every second, so a lost
notification or a lost listening connection delays a front end by a second, not for ever.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator, Sequence, TypeVar

import psycopg

from reef.commit.commit_log import adopt_entries, check_whole_log, committed_retry, stamped
from reef.core.canonical import canonical_json, check_scenario_name
from reef.core.errors import Corruption, InvalidInput, StaleHead, StorageUnavailable
from reef.core.types import CommitEntry, Operation
from reef.observe.pg_connections import (
    Connection,
    ConnectionPool,
    Cursor,
    DeadConnection,
    close_quietly,
    connect,
    describe,
    migrate,
    retrying,
    rollback_quietly,
    run_with_retries,
)

T = TypeVar("T")

COMMIT_LOG_VERSION = 2  # 2: an archive may move a scenario's rows aside (the trigger lets only that through)
LOCK_TIMEOUT_MS = 60_000  # a writer waits this long for another front end's hold on a scenario
IDLE_TIMEOUT_MS = 300_000  # a holder idle this long (a hung front end) loses its hold
_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
NOTIFY_CHANNEL = "reef_commit_log"  # payload: schema, scenario, step (tab-separated)

# Runs with search_path set to the schema, so the names below live there.
SCHEMA = """
CREATE TABLE IF NOT EXISTS commit_log (
    scenario TEXT NOT NULL,
    step BIGINT NOT NULL CHECK (step >= 1),
    operation TEXT NOT NULL,
    body TEXT NOT NULL,
    recorded_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (scenario, step)
);
CREATE TABLE IF NOT EXISTS commit_heads (
    scenario TEXT PRIMARY KEY,
    last_step BIGINT NOT NULL CHECK (last_step >= 0)
);
CREATE OR REPLACE FUNCTION commit_log_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- an archive moves a live scenario's steps aside, unchanged: only the key, to archived/<it>/<stamp>
    IF TG_OP = 'UPDATE' AND OLD.scenario NOT LIKE 'archived/%'
        AND left(NEW.scenario, length(OLD.scenario) + 10) = 'archived/' || OLD.scenario || '/'
        AND (NEW.step, NEW.operation, NEW.body, NEW.recorded_at) = (OLD.step, OLD.operation, OLD.body, OLD.recorded_at)
    THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the Reef commit log is append-only: % refused', TG_OP;
END $$;
CREATE OR REPLACE TRIGGER commit_log_append_only BEFORE UPDATE OR DELETE ON commit_log
    FOR EACH ROW EXECUTE FUNCTION commit_log_is_append_only();
CREATE OR REPLACE TRIGGER commit_log_no_truncate BEFORE TRUNCATE ON commit_log
    FOR EACH STATEMENT EXECUTE FUNCTION commit_log_is_append_only();
"""


_LIVE = "scenario NOT LIKE 'archived/%%'"  # archived scenarios' rows (reef/commit/archived_names.py) are no scenario's


class PgCommitLogs:
    """Every scenario's commit log in one PostgreSQL schema (`CommitLogs`)."""

    shared = True  # every front end on the database appends to these logs: follow their heads

    def __init__(self, dsn: str, *, schema: str = "reef", pool_size: int = 8) -> None:
        self.dsn = dsn
        self.schema = schema
        self.where = describe(dsn, schema)
        self.pool = ConnectionPool(self._connect, pool_size)
        try:
            self.run(self._migrate, begin="BEGIN")
        except BaseException:
            self.pool.close()
            raise

    def _connect(self) -> Connection:
        return connect(
            self.dsn,
            self.schema,
            f"SET lock_timeout TO {LOCK_TIMEOUT_MS}",
            f"SET idle_in_transaction_session_timeout TO {IDLE_TIMEOUT_MS}",
        )

    def _migrate(self, cur: Cursor) -> None:
        migrate(cur, self.schema, self.where, "commit log", COMMIT_LOG_VERSION, lambda _version: cur.execute(SCHEMA))

    def run(self, work: Callable[[Cursor], T], begin: str | None = None) -> T:
        """`work` on a pooled connection (`begin`: in one transaction), retried when the
        connection was found dead before anything was written."""
        return run_with_retries(self.pool, self.where, work, begin)

    # -- CommitLogs ------------------------------------------------------------------------

    def open(self, scenario: str) -> PgCommitLog:
        return PgCommitLog(self, check_scenario_name(scenario))

    def recover(self) -> list[PgCommitLog]:
        def work(cur: Cursor) -> tuple[list[tuple[str, int, str]], dict[str, int]]:
            rows = cur.execute(
                f"SELECT scenario, step, body FROM commit_log WHERE {_LIVE} ORDER BY scenario, step"
            ).fetchall()
            heads = dict(cur.execute(f"SELECT scenario, last_step FROM commit_heads WHERE {_LIVE}").fetchall())
            return rows, heads

        rows, heads = self.run(work, begin=_SNAPSHOT)
        by_scenario: dict[str, list[CommitEntry]] = {}
        for scenario, step, body in rows:
            entries = by_scenario.setdefault(scenario, [])
            entries.append(_parse(self._where_of(scenario), scenario, len(entries) + 1, int(step), body))
        logs = []
        for scenario, entries in by_scenario.items():
            where = self._where_of(scenario)
            if entries[0].operation is not Operation.CREATION:
                raise Corruption(where, 1, "the first step must be the creation of the scenario")
            if heads.get(scenario) != len(entries):
                raise Corruption(
                    where,
                    None,
                    f"commit_heads says last step {heads.get(scenario)}, the log ends at step {len(entries)}",
                )
            logs.append(PgCommitLog(self, scenario, entries))
        return logs

    def adopt(self, scenario: str, entries: Sequence[CommitEntry]) -> bool:
        return adopt_entries(self, scenario, entries)

    def heads(self) -> dict[str, int]:
        """Every scenario's last step, in one query (what a follower compares)."""
        rows = self.run(
            lambda cur: cur.execute(
                f"SELECT scenario, last_step FROM commit_heads WHERE last_step > 0 AND {_LIVE}"
            ).fetchall()
        )
        return {scenario: int(step) for scenario, step in rows}

    def archived(self) -> dict[str, int]:
        rows = self.run(
            lambda cur: cur.execute(f"SELECT scenario, last_step FROM commit_heads WHERE NOT ({_LIVE})").fetchall()
        )
        return {name: int(step) for name, step in sorted(rows)}

    def watch(self) -> PgHeadWatch:
        """A listener woken by every step committed in this schema."""
        return PgHeadWatch(self.dsn, self.schema)

    def close(self) -> None:
        self.pool.close()

    def _where_of(self, scenario: str) -> str:
        return f"{self.where} commit_log[{scenario!r}]"


class PgCommitLog:
    """One scenario's steps in the shared table (`CommitLog`). Thread-safe; the steps read so
    far are cached (the log only grows) and each read fetches the ones after them."""

    def __init__(self, logs: PgCommitLogs, scenario: str, entries: Sequence[CommitEntry] = ()) -> None:
        self.scenario: str | None = scenario
        self.where = logs._where_of(scenario)
        self._logs = logs
        self._lock = threading.RLock()
        self._entries: list[CommitEntry] = list(entries)
        self._depth = 0
        self._stack: ExitStack | None = None  # the pooled connection a transaction holds
        self._conn: Connection | None = None
        self._held = False  # a database transaction holding the scenario's row is open on _conn
        self._closed = False

    def close(self) -> None:
        self._closed = True

    # -- reading -------------------------------------------------------------------------

    def entries(self) -> list[CommitEntry]:
        with self._reading():
            return list(self._entries)

    @property
    def last_step(self) -> int:
        with self._reading():
            return len(self._entries)

    def last(self) -> CommitEntry | None:
        with self._reading():
            return self._entries[-1] if self._entries else None

    # -- writing -------------------------------------------------------------------------

    def append(self, entry: CommitEntry, expected_step: int) -> CommitEntry:
        if entry.scenario != self.scenario:
            raise InvalidInput(f"entry for scenario {entry.scenario!r} in the log of {self.scenario!r}")
        with self.transaction():
            self._refresh()
            existing = committed_retry(self.where, self._entries, entry, expected_step)
            if existing is not None:
                return existing
            entry = stamped(entry)
            self._commit([entry], expected_step)
            return entry

    def append_all(self, entries: Sequence[CommitEntry]) -> None:
        """Write a whole log (steps 1..n) into this empty one, in one transaction."""
        with self.transaction():
            self._refresh()
            check_whole_log(self.where, self.scenario, self._entries, entries)
            if entries:
                self._commit([stamped(e) for e in entries], 0)

    def archive(self, archived_as: str) -> None:
        with self.transaction():
            with self._db("archive"):
                self._hold()
                assert self._conn is not None
                with self._conn.cursor() as cur:
                    for table in ("commit_log", "commit_heads"):
                        cur.execute(
                            f"UPDATE {table} SET scenario = %s WHERE scenario = %s", (archived_as, self.scenario)
                        )
                    cur.execute("COMMIT")
                    self._held = False
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[PgCommitLog]:
        with self._lock:
            if self._closed:
                raise StorageUnavailable(f"{self.where}: commit log is closed")
            self._depth += 1
            try:
                if self._depth == 1:
                    self._acquire()
                yield self
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._release()

    # -- internals -------------------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[None]:
        with self._lock:
            if self._closed:
                raise StorageUnavailable(f"{self.where}: commit log is closed")
            self._refresh()
            yield

    def _refresh(self) -> None:
        """Fetch the steps committed after the cached ones: on the held connection inside a
        transaction (after the lock, so they are the latest), else on any pooled one."""
        if self._conn is None:
            self._entries.extend(self._logs.run(self._read_new))
            return
        with self._db("read"):
            self._hold()
            with self._conn.cursor() as cur:
                self._entries.extend(self._read_new(cur))
                (last_step,) = cur.execute(
                    "SELECT last_step FROM commit_heads WHERE scenario = %s", (self.scenario,)
                ).fetchone() or (0,)
        if last_step != len(self._entries):
            raise Corruption(
                self.where, None, f"commit_heads says last step {last_step}, the log ends at step {len(self._entries)}"
            )

    def _read_new(self, cur: Cursor) -> list[CommitEntry]:
        after = len(self._entries)
        rows = cur.execute(
            "SELECT step, body FROM commit_log WHERE scenario = %s AND step > %s ORDER BY step", (self.scenario, after)
        ).fetchall()
        assert self.scenario is not None
        return [_parse(self.where, self.scenario, after + i, int(step), body) for i, (step, body) in enumerate(rows, 1)]

    def _acquire(self) -> None:
        """Take a pooled connection for the transaction and lock the scenario's row on it; a
        connection found dead before anything was written is replaced (`retrying`)."""
        retrying(self._logs.pool, f"{self.where}: cannot hold the commit log", self._take_and_hold)

    def _take_and_hold(self) -> None:
        stack = ExitStack()
        try:
            self._conn = stack.enter_context(self._logs.pool.connection())
            self._stack = stack
            self._hold()
        except psycopg.OperationalError as exc:
            dead = self._conn is not None and self._conn.broken
            self._release()
            if dead:
                raise DeadConnection() from exc
            raise StorageUnavailable(f"{self.where}: cannot hold the commit log: {exc}") from exc
        except BaseException:
            self._release()
            raise

    def _hold(self) -> None:
        """Begin a transaction that locks the scenario's row, unless one is open (an append
        commits, so a transaction that goes on after it locks again)."""
        if self._held:
            return
        assert self._conn is not None
        with self._conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            self._held = True
            lock = "SELECT last_step FROM commit_heads WHERE scenario = %s FOR UPDATE"
            if cur.execute(lock, (self.scenario,)).fetchone() is None:
                cur.execute(
                    "INSERT INTO commit_heads (scenario, last_step) VALUES (%s, 0) ON CONFLICT (scenario) DO NOTHING",
                    (self.scenario,),
                )
                cur.execute(lock, (self.scenario,))

    def _commit(self, entries: list[CommitEntry], expected: int) -> None:
        """Insert the steps, move last_step from `expected` by compare-and-swap, COMMIT."""
        assert self._conn is not None
        with self._db("append to"):
            self._hold()
            with self._conn.cursor() as cur:
                try:
                    cur.executemany(
                        "INSERT INTO commit_log (scenario, step, operation, body, recorded_at) VALUES (%s, %s, %s, %s, %s)",
                        [
                            (e.scenario, e.step, e.operation.value, canonical_json(e.to_json()), e.recorded_at)
                            for e in entries
                        ],
                    )
                    cur.execute(
                        "UPDATE commit_heads SET last_step = %s WHERE scenario = %s AND last_step = %s",
                        (expected + len(entries), self.scenario, expected),
                    )
                except psycopg.errors.UniqueViolation as exc:
                    self._abort()
                    raise StaleHead(f"{self.where}: step {expected + 1} was committed by another writer") from exc
                if cur.rowcount != 1:
                    self._abort()
                    raise StaleHead(f"{self.where}: the last step is no longer {expected}")
                cur.execute(
                    "SELECT pg_notify(%s, %s)",  # delivered at COMMIT, and only if it commits
                    (NOTIFY_CHANNEL, f"{self._logs.schema}\t{self.scenario}\t{entries[-1].step}"),
                )
                try:
                    cur.execute("COMMIT")
                except psycopg.Error as exc:
                    self._held = False
                    raise StorageUnavailable(
                        f"{self.where}: the commit of step {entries[-1].step} failed and may or may not have "
                        f"happened ({exc}); an identical retry settles it"
                    ) from exc
                self._held = False
        self._entries.extend(entries)

    @contextmanager
    def _db(self, what: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            self._abort()
            raise StorageUnavailable(
                f"{self.where}: cannot {what} the commit log: {type(exc).__name__}: {exc}"
            ) from exc

    def _abort(self) -> None:
        if self._held and self._conn is not None:
            rollback_quietly(self._conn)
        self._held = False

    def _release(self) -> None:
        self._abort()  # every append committed already: what is left is the lock
        stack, self._stack, self._conn = self._stack, None, None
        if stack is not None:
            stack.close()


class PgHeadWatch:
    """`LISTEN reef_commit_log` on a connection of its own. `wait(timeout)` returns True when a
    step of this schema committed (or the connection was just made, and one may have been
    missed), False after `timeout` without one. A lost connection is made again on the next
    wait; meanwhile the caller's polling carries on. Used from one thread at a time."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._waiting = False
        self._closed = False

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._closed:
                return False
            self._waiting = True
        try:
            if self._conn is None:
                self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(2, int(timeout) + 1))
                self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                return True
            while (left := deadline - time.monotonic()) > 0:
                for note in self._conn.notifies(timeout=left, stop_after=1):
                    if note.payload.split("\t", 1)[0] == self.schema:
                        return True
            return False
        except psycopg.Error:
            self._drop()
            time.sleep(max(0.0, deadline - time.monotonic()))
            return False
        finally:
            with self._lock:
                self._waiting = False
                if self._closed:
                    self._drop()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if not self._waiting:
                self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        close_quietly(conn)


def _parse(where: str, scenario: str, expected_step: int, step: int, body: str) -> CommitEntry:
    if step != expected_step:
        raise Corruption(where, expected_step, f"step {step} where step {expected_step} belongs")
    try:
        entry = CommitEntry.from_json(json.loads(body))
    except (ValueError, KeyError, TypeError) as exc:
        raise Corruption(where, step, f"unreadable commit step: {exc}") from None
    if entry.step != step or entry.scenario != scenario:
        raise Corruption(where, step, f"row holds step {entry.step} of scenario {entry.scenario!r}")
    return entry
