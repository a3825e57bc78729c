"""The commit log: steps +1, durable appends, identical retries, compare-and-swap, races.

The contract runs against every backend (`CommitLogs`): one JSONL file per scenario (the
single-node default) and the shared table on PostgreSQL (a throwaway cluster from tests/pg.py,
a fresh schema per test; skipped, saying why, where the binaries are missing). `front_end()`
opens another backend instance on the same data, standing in for another process or machine.
Damage is backend-specific: torn lines and file:line errors for JSONL, rows for PostgreSQL.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator
from uuid import uuid4

import pytest

from reef.commit.commit_log import CommitLog, CommitLogs, JsonlCommitLog, JsonlCommitLogs
from reef.core.errors import Conflict, Corruption, InvalidInput, StaleHead, StorageUnavailable
from reef.core.types import CommitEntry, Operation, ReleaseRef
from tests.pg import postgres_dsn  # noqa: F401  (session fixture used by the postgres params)

FrontEnd = Callable[[], CommitLogs]


def entry(step: int, scenario: str = "s", **fields: object) -> CommitEntry:
    operation = Operation.CREATION if step == 1 else Operation.TRAINING
    return CommitEntry(
        scenario=scenario,
        step=step,
        operation=operation,  # type: ignore[arg-type]
        release=ReleaseRef(f"r{step}", f"c{step}"),
        **fields,
    )


def _backend_maker(kind: str, where: str) -> FrontEnd:
    """Picklable description -> opener (the process race re-opens the backend in a child)."""
    if kind == "jsonl":
        return lambda: JsonlCommitLogs(where)
    from reef.commit.pg_commit_log import PgCommitLogs

    dsn, schema = where.split("|")
    return lambda: PgCommitLogs(dsn, schema=schema, pool_size=4)


@pytest.fixture(params=["jsonl", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "jsonl":
        yield "jsonl", str(tmp_path / "commits")
    else:
        yield "postgres", f"{request.getfixturevalue('postgres_dsn')}|t_{uuid4().hex[:12]}"


@pytest.fixture
def front_end(backend: tuple[str, str]) -> Iterator[FrontEnd]:
    """Opens backend instances on the same data (each one a front end); closes them all."""
    make = _backend_maker(*backend)
    opened: list[CommitLogs] = []

    def opener() -> CommitLogs:
        opened.append(make())
        return opened[-1]

    yield opener
    for logs in opened:
        logs.close()


@pytest.fixture
def log(front_end: FrontEnd) -> CommitLog:
    return front_end().open("s")


# -- the contract -------------------------------------------------------------------------


def test_both_backends_implement_the_interface(front_end: FrontEnd, log: CommitLog) -> None:
    assert isinstance(front_end(), CommitLogs) and isinstance(log, CommitLog)


def test_steps_append_in_order_and_survive_reopen(front_end: FrontEnd, log: CommitLog) -> None:
    for step in range(1, 4):
        log.append(entry(step, metrics={"loss": step / 10}), expected_step=step - 1)
    written = log.entries()
    log.close()
    (again,) = front_end().recover()
    assert again.scenario == "s" and again.entries() == written
    assert [e.step for e in again.entries()] == [1, 2, 3]
    assert again.entries()[2].metrics == {"loss": 0.3}
    assert all(e.recorded_at > 0 for e in again.entries())
    assert front_end().open("s").entries() == written


def test_identical_retry_returns_the_original(log: CommitLog) -> None:
    first = log.append(entry(1), expected_step=0)
    retried = log.append(replace(entry(1), recorded_at=123.0), expected_step=0)
    assert retried == first
    assert log.last_step == 1 and log.last() == first


def test_other_content_for_a_committed_step_is_a_conflict(log: CommitLog) -> None:
    log.append(entry(1), expected_step=0)
    with pytest.raises(Conflict, match="step 1"):
        log.append(entry(1, metrics={"other": 1}), expected_step=0)
    assert log.last_step == 1


def test_stale_expected_step_is_a_conflict(log: CommitLog) -> None:
    log.append(entry(1), expected_step=0)
    log.append(entry(2), expected_step=1)
    with pytest.raises(StaleHead):
        log.append(entry(3), expected_step=1)
    with pytest.raises(InvalidInput):
        log.append(entry(4), expected_step=2)  # a step must be the next one
    assert log.last_step == 2


def test_an_entry_of_another_scenario_is_refused(log: CommitLog) -> None:
    with pytest.raises(InvalidInput, match="other"):
        log.append(entry(1, scenario="other"), expected_step=0)
    assert log.last_step == 0


def test_threads_racing_on_one_step_have_exactly_one_winner(log: CommitLog) -> None:
    log.append(entry(1), expected_step=0)
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def contend(i: int) -> None:
        barrier.wait()
        try:
            log.append(entry(2, metrics={"writer": i}), expected_step=1)
            outcomes.append("won")
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("won") == 1 and outcomes.count("conflict") == 7
    assert log.last_step == 2


def test_front_ends_racing_on_one_step_have_exactly_one_winner(front_end: FrontEnd) -> None:
    logs = [front_end().open("s") for _ in range(4)]
    logs[0].append(entry(1), expected_step=0)
    outcomes: list[str] = []
    barrier = threading.Barrier(len(logs))

    def contend(i: int) -> None:
        barrier.wait()
        try:
            logs[i].append(entry(2, metrics={"writer": i}), expected_step=1)
            outcomes.append("won")
        except Conflict:  # StaleHead is a Conflict
            outcomes.append("conflict")

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(len(logs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["conflict"] * 3 + ["won"]
    assert all(lg.entries() == logs[0].entries() for lg in logs) and logs[0].last_step == 2


def test_a_second_front_end_sees_steps_appended_by_the_first(front_end: FrontEnd) -> None:
    a, b = front_end().open("s"), front_end().open("s")
    a.append(entry(1), expected_step=0)
    assert b.last_step == 1
    with pytest.raises(StaleHead):
        b.append(entry(3), expected_step=0)
    b.append(entry(2), expected_step=1)
    assert a.last_step == 2 and a.entries() == b.entries()


def test_a_transaction_holds_the_log_against_other_front_ends(front_end: FrontEnd) -> None:
    a, b = front_end().open("s"), front_end().open("s")
    a.append(entry(1), expected_step=0)
    order: list[str] = []
    result: list[BaseException | CommitEntry] = []

    def other_writer() -> None:
        try:
            result.append(b.append(entry(2, metrics={"writer": "b"}), expected_step=1))
        except Conflict as exc:
            result.append(exc)
        order.append("b done")

    with a.transaction():
        assert a.last_step == 1
        writer = threading.Thread(target=other_writer)
        writer.start()
        time.sleep(0.3)  # b is waiting for the log
        assert not order
        order.append("a appends")
        a.append(entry(2, metrics={"writer": "a"}), expected_step=1)
    writer.join(timeout=30)
    assert order == ["a appends", "b done"]
    assert isinstance(result[0], Conflict)
    assert b.entries()[-1].metrics == {"writer": "a"}


def test_an_append_commits_as_it_returns_even_inside_a_transaction(front_end: FrontEnd, log: CommitLog) -> None:
    with pytest.raises(RuntimeError):
        with log.transaction():
            log.append(entry(1), expected_step=0)
            raise RuntimeError("the caller failed after its append")
    assert front_end().open("s").last_step == 1
    with log.transaction():  # the log goes on after an append inside a transaction
        log.append(entry(2), expected_step=1)
        log.append(entry(3), expected_step=2)
        assert log.last_step == 3
    assert front_end().open("s").last_step == 3


def test_recovery_lists_every_scenario_with_steps(front_end: FrontEnd) -> None:
    logs = front_end()
    for name in ("a", "b.2-x_y"):
        logs.open(name).append(entry(1, scenario=name), expected_step=0)
    empty = logs.open("never-created")
    with empty.transaction():
        pass  # held and let go without a step: still no scenario
    assert sorted(lg.scenario or "" for lg in front_end().recover()) == ["a", "b.2-x_y"]


def test_adopt_takes_a_whole_log_only_into_an_empty_one(front_end: FrontEnd) -> None:
    steps = [entry(1, recorded_at=5.0), entry(2, recorded_at=6.0), entry(3, recorded_at=7.0)]
    logs = front_end()
    assert logs.adopt("s", steps) is True
    assert front_end().open("s").entries() == steps
    assert logs.adopt("s", steps[:1]) is False
    with pytest.raises(InvalidInput):
        logs.adopt("t", [entry(2, scenario="t")])
    assert front_end().open("t").last_step == 0


def test_a_closed_log_refuses_use(log: CommitLog) -> None:
    log.close()
    with pytest.raises(StorageUnavailable):
        log.append(entry(1), expected_step=0)


def _append_from_process(kind: str, where: str, writer: int, start, out) -> None:  # type: ignore[no-untyped-def]
    log = _backend_maker(kind, where)().open("s")
    start.wait()
    try:
        log.append(entry(2, metrics={"writer": writer}), expected_step=1)
        out.put("won")
    except Conflict:
        out.put("conflict")


def test_processes_racing_on_one_step_have_exactly_one_winner(backend: tuple[str, str], log: CommitLog) -> None:
    log.append(entry(1), expected_step=0)
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_append_from_process, args=(*backend, i, start, out)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=30)
    results = sorted(out.get(timeout=5) for _ in procs)
    assert results == ["conflict", "conflict", "conflict", "won"]
    assert [e.step for e in log.entries()] == [1, 2]


# -- JSONL: the file -------------------------------------------------------------------------


def test_torn_last_line_is_truncated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    log = JsonlCommitLog(path)
    log.append(entry(1), expected_step=0)
    log.close()
    whole = path.read_bytes()
    with path.open("ab") as f:
        f.write(b'{"record":"reef-commit/1","scenario":"s","st')
    reopened = JsonlCommitLog(path)
    assert reopened.last_step == 1
    assert path.read_bytes() == whole
    reopened.append(entry(2), expected_step=1)
    assert [e.step for e in JsonlCommitLog(path).entries()] == [1, 2]


def test_damage_before_the_last_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    log = JsonlCommitLog(path)
    for step in range(1, 4):
        log.append(entry(step), expected_step=step - 1)
    log.close()
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1][:20] + b"#garbage#" + lines[1][20:]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(Corruption) as info:
        JsonlCommitLog(path)
    assert info.value.line == 2 and str(path) in str(info.value)


def test_a_complete_but_unparsable_last_line_is_damage_not_a_tear(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    log = JsonlCommitLog(path)
    log.append(entry(1), expected_step=0)
    log.close()
    with path.open("ab") as f:
        f.write(b"not json\n")
    with pytest.raises(Corruption, match=":2:"):
        JsonlCommitLog(path)


def test_a_step_out_of_sequence_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(entry(1).to_json()) + "\n" + json.dumps(entry(3).to_json()) + "\n")
    with pytest.raises(Corruption, match="step 3 where step 2 belongs"):
        JsonlCommitLog(path)


def test_jsonl_logs_name_a_file_for_another_scenario_as_damage(tmp_path: Path) -> None:
    logs = JsonlCommitLogs(tmp_path)
    logs.open("a").append(entry(1, scenario="a"), expected_step=0)
    logs.path_of("a").rename(logs.path_of("b"))
    with pytest.raises(Corruption, match="named for"):
        logs.recover()


# -- PostgreSQL: the table ---------------------------------------------------------------------


@pytest.fixture
def pg_logs(postgres_dsn: str) -> Iterator[tuple[str, str]]:  # noqa: F811
    pytest.importorskip("psycopg")
    yield postgres_dsn, f"t_{uuid4().hex[:12]}"


def _sql(dsn: str, schema: str, statement: str, *args: object) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute(statement, args or None)


@pytest.mark.postgres
def test_postgres_table_is_append_only(pg_logs: tuple[str, str]) -> None:
    import psycopg

    from reef.commit.pg_commit_log import PgCommitLogs

    dsn, schema = pg_logs
    with_logs = PgCommitLogs(dsn, schema=schema)
    try:
        with_logs.open("s").append(entry(1), expected_step=0)
        for statement in ("UPDATE commit_log SET body = 'x'", "DELETE FROM commit_log", "TRUNCATE commit_log"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                _sql(dsn, schema, statement)
        assert with_logs.open("s").last_step == 1
    finally:
        with_logs.close()


@pytest.mark.postgres
@pytest.mark.parametrize(
    "damage, message",
    [
        ("UPDATE commit_log SET body = 'not json' WHERE step = 2", r"commit_log\['s'\]:2: unreadable"),
        ("DELETE FROM commit_log WHERE step = 2", r"commit_log\['s'\]:2: step 3 where step 2 belongs"),
        ("UPDATE commit_heads SET last_step = 7", "commit_heads says last step 7"),
        (
            'UPDATE commit_log SET body = replace(body, \'"scenario":"s"\', \'"scenario":"t"\') WHERE step = 3',
            r":3: row holds step 3 of scenario 't'",
        ),
    ],
)
def test_postgres_damage_names_database_scenario_and_step(pg_logs: tuple[str, str], damage: str, message: str) -> None:
    from reef.commit.pg_commit_log import PgCommitLogs

    dsn, schema = pg_logs
    logs = PgCommitLogs(dsn, schema=schema)
    try:
        log = logs.open("s")
        for step in (1, 2, 3):
            log.append(entry(step), expected_step=step - 1)
        _sql(dsn, schema, "ALTER TABLE commit_log DISABLE TRIGGER USER")  # what only an operator could do
        _sql(dsn, schema, damage)
        with pytest.raises(Corruption, match=message) as info:
            logs.recover()
        assert f"schema {schema}" in str(info.value)
    finally:
        logs.close()


@pytest.mark.postgres
def test_postgres_refuses_a_newer_commit_log_version(pg_logs: tuple[str, str]) -> None:
    from reef.commit.pg_commit_log import PgCommitLogs

    dsn, schema = pg_logs
    PgCommitLogs(dsn, schema=schema).close()
    _sql(dsn, schema, "UPDATE meta SET value = '99' WHERE key = 'commit_log_version'")
    with pytest.raises(StorageUnavailable, match="version 99 is newer"):
        PgCommitLogs(dsn, schema=schema)


@pytest.mark.postgres
def test_postgres_unreachable_is_storage_unavailable() -> None:
    pytest.importorskip("psycopg")
    from reef.commit.pg_commit_log import PgCommitLogs

    with pytest.raises(StorageUnavailable):
        PgCommitLogs("host=127.0.0.1 port=1 user=postgres dbname=postgres connect_timeout=2")


@pytest.mark.postgres
def test_postgres_log_survives_dropped_connections(pg_logs: tuple[str, str]) -> None:
    import psycopg

    from reef.commit.pg_commit_log import PgCommitLogs

    dsn, schema = pg_logs
    logs = PgCommitLogs(dsn, schema=schema, pool_size=2)
    try:
        log = logs.open("s")
        log.append(entry(1), expected_step=0)
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
        log.append(entry(2), expected_step=1)  # a dead pooled connection is replaced
        assert logs.open("s").last_step == 2
    finally:
        logs.close()
