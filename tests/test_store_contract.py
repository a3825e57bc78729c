"""The experience-store contract (reef/observe/store.py), run against every backend.

Each test gets a `store` on SQLite (a real file) and on PostgreSQL (a throwaway cluster from
tests/pg.py, a fresh schema per test). `open_store` opens another instance on the same data,
standing in for a second front end.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator
from uuid import uuid4

import pytest

from reef.core.errors import InvalidInput, NotFound, RecordConflict, StorageUnavailable
from reef.core.types import Record, RecordStatus, ReleaseRef, Report, TokenSpan
from reef.observe.sqlite_store import SQLiteStore
from reef.observe.store import ExperienceStore
from tests.pg import postgres_dsn  # noqa: F401  (session fixture used by the postgres params)

SCENARIO = "contract"
OTHER = "elsewhere"
RELEASE = ReleaseRef("rel-1", "content-1", "load-1")
Opener = Callable[[], ExperienceStore]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens store instances that share one backing store; closes them all at the end."""
    opened: list[ExperienceStore] = []
    if request.param == "sqlite":
        make: Opener = lambda: SQLiteStore(tmp_path / "experience.db")  # noqa: E731
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        from reef.observe.postgres_store import PostgresStore

        schema = f"t_{uuid4().hex[:12]}"
        make = lambda: PostgresStore(dsn, schema=schema)  # noqa: E731

    def opener() -> ExperienceStore:
        opened.append(make())
        return opened[-1]

    yield opener
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store: Opener) -> ExperienceStore:
    return open_store()


# -- builders ----------------------------------------------------------------------------


def pending(rid: str | None = None, *, scenario: str = SCENARIO, session: str | None = None, **content: Any) -> Record:
    request = content.pop("request", {"messages": [{"role": "user", "content": f"hello {rid}"}]})
    return Record(rid or uuid4().hex, scenario, RELEASE, request, session=session, **content)


def full(rid: str) -> Record:
    """A complete record with every field set."""
    return Record(
        id=rid,
        scenario=SCENARIO,
        release=RELEASE,
        request={"model": "m", "messages": [{"role": "user", "content": "héllo ✓ \u0000"}], "temperature": 0.5},
        status=RecordStatus.COMPLETE,
        response={"choices": [{"message": {"role": "assistant", "content": "hi"}}]},
        token_ids=[1, 2, 3],
        logprobs=[-0.1, -2.5, -1e-300],
        spans=[TokenSpan(0, 2, "load-1"), TokenSpan(2, 3, "load-2")],
        session="sess-1",
        tags={"team": "a", "run": "7"},
        timings={"queued_s": 0.01, "total_s": 1.25},
    )


OUTCOME: dict[str, Any] = {
    "response": {"content": "done"},
    "token_ids": [5, 6],
    "logprobs": [-0.5, -0.25],
    "spans": [TokenSpan(0, 2, "load-1")],
}


def report(refs: list[str], *, rid: str | None = None, scenario: str = SCENARIO, score: float = 1.0) -> Report:
    return Report(rid or uuid4().hex, scenario, tuple(refs), score, feedback={"why": "ok"}, metadata={"k": 1})


def same(a: Record | Report, b: Record | Report) -> bool:
    return a.to_json() == b.to_json()


# -- records -----------------------------------------------------------------------------


def test_record_round_trips_every_field(store: ExperienceStore) -> None:
    record = full("r-full")
    stored = store.put_record(record)
    assert isinstance(stored.seq, int)
    assert same(stored, replace(record, seq=stored.seq))
    assert same(store.get_record("r-full"), stored)


def test_a_stitched_session_names_the_record_in_the_store_only(store: ExperienceStore) -> None:
    first = store.put_record(pending("r-bare"))
    assert store.stitch_session("r-bare", "stitched:r-0") and not store.stitch_session("r-bare", "other")
    assert [s.session for s in store.iter_records(SCENARIO)] == ["stitched:r-0"]
    assert store.get_record("r-bare").session is None  # its content keeps what the client sent
    assert store.put_record(pending("r-bare")).seq == first.seq  # so a retry still matches it


def test_identical_retry_returns_the_same_seq(store: ExperienceStore) -> None:
    first = store.put_record(pending("r1"))
    assert same(store.put_record(pending("r1")), first)
    done = store.put_record(full("r2"))
    assert store.put_record(full("r2")).seq == done.seq
    assert store.count_records() == 2


@pytest.mark.parametrize(
    "change",
    [{"request": {"other": True}}, {"tags": {"team": "b"}}, {"session": "s-9"}, {"release": None}],
)
def test_other_content_under_an_id_conflicts_and_changes_nothing(
    store: ExperienceStore, change: dict[str, Any]
) -> None:
    stored = store.put_record(pending("r1", tags={"team": "a"}))
    with pytest.raises(RecordConflict):
        store.put_record(replace(pending("r1", tags={"team": "a"}), **change))
    assert same(store.get_record("r1"), stored)
    assert store.count_records() == 1


def test_finish_moves_in_progress_to_complete(store: ExperienceStore) -> None:
    stored = store.put_record(pending("r1", timings={"admitted_s": 1.0}))
    done = store.finish_record("r1", RecordStatus.COMPLETE, timings={"total_s": 2.0}, **OUTCOME)
    assert done.status is RecordStatus.COMPLETE and done.seq == stored.seq
    assert done.timings == {"admitted_s": 1.0, "total_s": 2.0}
    assert done.token_ids == [5, 6] and done.spans == [TokenSpan(0, 2, "load-1")]
    assert same(store.get_record("r1"), done)


def test_finish_retry_is_idempotent_and_a_different_finish_conflicts(store: ExperienceStore) -> None:
    store.put_record(pending("r1"))
    done = store.finish_record("r1", RecordStatus.COMPLETE, **OUTCOME)
    assert same(store.finish_record("r1", RecordStatus.COMPLETE, **OUTCOME), done)
    with pytest.raises(RecordConflict):
        store.finish_record("r1", RecordStatus.COMPLETE, **{**OUTCOME, "token_ids": [5, 7]})
    with pytest.raises(RecordConflict):
        store.finish_record("r1", RecordStatus.INCOMPLETE, error="client went away")
    assert same(store.get_record("r1"), done)


def test_finish_as_incomplete_keeps_the_error(store: ExperienceStore) -> None:
    store.put_record(pending("r1"))
    done = store.finish_record("r1", RecordStatus.INCOMPLETE, error="client went away")
    assert store.get_record("r1").error == "client went away" == done.error
    with pytest.raises(InvalidInput):
        store.finish_record("r1", RecordStatus.IN_PROGRESS)


def test_finish_of_an_unknown_record_is_not_found(store: ExperienceStore) -> None:
    with pytest.raises(NotFound):
        store.finish_record("nope", RecordStatus.COMPLETE, **OUTCOME)
    assert store.count_records() == 0


def test_putting_the_complete_record_finishes_an_in_progress_one(store: ExperienceStore) -> None:
    started = replace(
        full("r1"), status=RecordStatus.IN_PROGRESS, response=None, token_ids=None, logprobs=None, spans=[]
    )
    stored = store.put_record(started)
    done = store.put_record(full("r1"))
    assert done.seq == stored.seq and done.status is RecordStatus.COMPLETE
    assert same(store.get_record("r1"), done)
    assert same(store.put_record(full("r1")), done)
    assert store.put_record(replace(full("r1"), status=RecordStatus.IN_PROGRESS)).status is RecordStatus.COMPLETE
    with pytest.raises(RecordConflict):
        store.put_record(replace(full("r1"), token_ids=[9, 9, 9]))
    assert same(store.get_record("r1"), done) and store.count_records() == 1


def test_a_write_is_visible_to_another_front_end_at_once(open_store: Opener) -> None:
    one, two = open_store(), open_store()
    stored = one.put_record(full("r1"))
    assert same(two.get_record("r1"), stored)
    two.put_report(report(["r1"], rid="p1"))
    assert [r.id for r in one.reports_for("r1")] == ["p1"]


def test_a_closed_store_is_unavailable(store: ExperienceStore) -> None:
    store.close()
    with pytest.raises(StorageUnavailable):
        store.put_record(pending("r1"))
    with pytest.raises(StorageUnavailable):
        store.get_record("r1")


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """`call()`, failing the test instead of hanging it if it is still blocked after `seconds`."""
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:  # handed to the caller below
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()  # a daemon: a stuck call cannot block exit
    return future.result(timeout=seconds)


NOT_JSON = [{"logprobs": [-math.inf]}, {"response": {"ids": {1, 2}}}]


@pytest.mark.parametrize("outcome", NOT_JSON, ids=["inf-logprob", "set-in-response"])
def test_an_outcome_that_is_not_json_is_refused_and_changes_nothing(
    store: ExperienceStore, outcome: dict[str, Any]
) -> None:
    stored = store.put_record(pending("r1"))
    with pytest.raises(InvalidInput):
        store.put_record(replace(pending("r1"), status=RecordStatus.COMPLETE, **outcome))
    with pytest.raises(InvalidInput):
        within(3.0, lambda: store.finish_record("r1", RecordStatus.COMPLETE, **outcome))
    assert within(3.0, lambda: store.put_record(pending("r2"))).seq is not None  # still takes writes
    assert same(store.get_record("r1"), stored)


# -- reports -----------------------------------------------------------------------------


def test_report_with_missing_references_names_each_and_stores_nothing(store: ExperienceStore) -> None:
    store.put_record(pending("known"))
    with pytest.raises(NotFound) as caught:
        store.put_report(report(["known", "ghost-1", "ghost-2"], rid="p1"))
    assert "ghost-1" in str(caught.value) and "ghost-2" in str(caught.value)
    assert "known" not in str(caught.value).split(":")[-1]
    assert store.count_reports() == 0 and store.reports_for("known") == []
    with pytest.raises(NotFound):
        store.get_report("p1")


def test_report_on_a_record_of_another_scenario_is_refused(store: ExperienceStore) -> None:
    store.put_record(pending("theirs", scenario=OTHER))
    with pytest.raises(NotFound, match="theirs"):
        store.put_report(report(["theirs"]))
    assert store.count_reports() == 0


def test_report_retry_is_idempotent_and_other_content_conflicts(store: ExperienceStore) -> None:
    store.put_record(pending("r1"))
    stored = store.put_report(report(["r1"], rid="p1"))
    assert stored.seq is not None and stored.created_at is not None
    assert same(store.put_report(report(["r1"], rid="p1")), stored)
    with pytest.raises(RecordConflict):
        store.put_report(report(["r1"], rid="p1", score=0.5))
    assert same(store.get_report("p1"), stored) and store.count_reports() == 1


@pytest.mark.parametrize("score", [math.nan, math.inf, -math.inf])
def test_a_non_finite_score_is_refused(score: float) -> None:
    with pytest.raises(InvalidInput, match="score"):
        report(["r1"], score=score)


def test_a_receipt_named_many_times_is_stored_once_in_first_named_order(store: ExperienceStore) -> None:
    for rid in ("a", "b"):
        store.put_record(pending(rid))
    named = ["a"] * 1000 + ["b", "a", "b"]
    stored = store.put_report(report(named, rid="p1"))
    assert stored.references == ("a", "b")
    assert store.get_report("p1").references == ("a", "b")
    [got] = store.reported_since(SCENARIO)
    assert [r.id for r in got.records] == ["a", "b"] and got.report.references == ("a", "b")
    assert same(store.put_report(report(named, rid="p1")), stored)  # the retry as sent is still identical
    assert same(store.put_report(report(["a", "b"], rid="p1")), stored)
    with pytest.raises(RecordConflict):
        store.put_report(report(["b", "a"], rid="p1"))  # another order is another trajectory


def test_reports_for_lists_the_reports_of_a_record(store: ExperienceStore) -> None:
    for rid in ("a", "b"):
        store.put_record(pending(rid))
    first = store.put_report(report(["a"], rid="p1"))
    store.put_report(report(["b"], rid="p2"))
    third = store.put_report(report(["b", "a"], rid="p3"))
    assert [r.to_json() for r in store.reports_for("a")] == [first.to_json(), third.to_json()]
    assert store.reports_for("unknown") == []


def test_reported_since_reads_reports_after_a_cursor_with_their_records(store: ExperienceStore) -> None:
    records = {rid: store.put_record(pending(rid)) for rid in ("a", "b", "c")}
    store.put_record(pending("x", scenario=OTHER))
    ours = []
    for i, refs in enumerate([["a"], ["b", "c"], ["c", "a"]]):
        ours.append(store.put_report(report(refs, rid=f"p{i}")))
        store.put_report(report(["x"], scenario=OTHER))
    got = store.reported_since(SCENARIO)
    assert [g.report.id for g in got] == ["p0", "p1", "p2"]
    assert [g.cursor for g in got] == [r.seq for r in ours] == sorted(r.seq for r in ours if r.seq)
    assert [[r.id for r in g.records] for g in got] == [["a"], ["b", "c"], ["c", "a"]]
    assert all(same(r, records[r.id]) for g in got for r in g.records)
    assert [g.report.id for g in store.reported_since(SCENARIO, got[0].cursor)] == ["p1", "p2"]
    assert [g.report.id for g in store.reported_since(SCENARIO, 0, limit=2)] == ["p0", "p1"]
    assert store.reported_since(SCENARIO, got[-1].cursor) == []
    assert [len(g.records) for g in store.reported_since(OTHER)] == [1, 1, 1]


def test_reported_since_leaves_out_compacted_records(store: ExperienceStore) -> None:
    for rid in ("a", "b"):
        store.put_record(pending(rid))
    store.put_report(report(["a", "b"]))
    store.compact(SCENARIO, ["a"])
    [got] = store.reported_since(SCENARIO)
    assert [r.id for r in got.records] == ["b"]


def test_session_records_come_in_creation_order(store: ExperienceStore) -> None:
    ids = []
    for i in range(6):
        rid = f"turn-{5 - i}"  # ids sort the other way round from creation
        store.put_record(pending(rid, session="s1" if i % 2 == 0 else "s2"))
        ids.append(rid)
    store.put_record(pending("lone"))
    store.put_record(pending("far", scenario=OTHER, session="s1"))
    assert [r.id for r in store.session_records(SCENARIO, "s1")] == ids[0::2]
    assert [r.id for r in store.session_records(SCENARIO, "s2")] == ids[1::2]
    assert store.session_records(SCENARIO, "nobody") == []


# -- compaction --------------------------------------------------------------------------


def test_compact_deletes_and_keeps_tombstones(store: ExperienceStore) -> None:
    for rid in ("a", "b", "c"):
        store.put_record(pending(rid))
    assert store.compact(SCENARIO, ["a", "b", "missing"]) == 2
    assert store.count_records() == 1
    with pytest.raises(NotFound):
        store.get_record("a")
    assert store.compact(SCENARIO, ["a", "b"]) == 0
    assert store.compact(OTHER, ["c"]) == 0 and store.count_records() == 1


def test_a_retry_of_a_compacted_record_dedups_without_resurrecting(store: ExperienceStore) -> None:
    store.put_record(pending("a"))
    store.compact(SCENARIO, ["a"])
    store.put_record(pending("a"))
    with pytest.raises(NotFound):
        store.get_record("a")
    with pytest.raises(RecordConflict):
        store.put_record(pending("a", request={"other": True}))
    with pytest.raises(NotFound):
        store.finish_record("a", RecordStatus.COMPLETE, **OUTCOME)
    assert store.count_records() == 0


def test_a_late_report_may_still_name_a_compacted_record(store: ExperienceStore) -> None:
    store.put_record(pending("a"))
    store.compact(SCENARIO, ["a"])
    stored = store.put_report(report(["a"], rid="late"))
    assert [r.id for r in store.reports_for("a")] == ["late"]
    assert [g.records for g in store.reported_since(SCENARIO)] == [()]
    assert stored.seq is not None


# -- iterating records (export) ---------------------------------------------------------


def test_iter_records_pages_in_seq_order_with_reports_and_filters(store: ExperienceStore) -> None:
    other_release = ReleaseRef("rel-2", "content-2", "load-2")
    ids = ["z-done", "y-open", "x-other-release", "w-failed", "v-gone"]  # ids sort against creation order
    store.put_record(replace(full("z-done"), session=None))
    store.put_record(pending("y-open"))
    store.put_record(replace(pending("x-other-release"), release=other_release))
    store.finish_record("x-other-release", RecordStatus.COMPLETE, **OUTCOME)
    store.put_record(pending("w-failed"))
    store.finish_record("w-failed", RecordStatus.INCOMPLETE, error="upstream timed out")
    store.put_record(pending("v-gone"))
    store.put_record(pending("far", scenario=OTHER))
    store.put_report(report(["z-done", "x-other-release"], rid="p1", score=0.5))
    store.put_report(report(["z-done"], rid="p2", score=1.0))
    store.put_report(report(["far"], rid="p-far", scenario=OTHER))
    store.compact(SCENARIO, ["v-gone"])

    def ids_of(**filters: Any) -> list[str]:
        return [item.record.id for item in store.iter_records(SCENARIO, page_size=2, **filters)]

    every = list(store.iter_records(SCENARIO, page_size=2))
    assert [item.record.id for item in every] == ids[:4]
    assert [item.record.seq for item in every] == sorted(item.record.seq for item in every)  # type: ignore[type-var]
    assert same(every[0].record, store.get_record("z-done"))
    assert [[r.id for r in item.reports] for item in every] == [["p1", "p2"], [], ["p1"], []]
    assert [r.score for r in every[0].reports] == [0.5, 1.0]
    created = [item.created_at for item in every]
    assert created == sorted(created) and all(isinstance(t, float) for t in created)
    assert every[1].finished_at is None and every[0].finished_at is not None
    assert ids_of(statuses={RecordStatus.COMPLETE}) == ["z-done", "x-other-release"]
    assert ids_of(statuses={RecordStatus.COMPLETE, RecordStatus.INCOMPLETE}) == [
        "z-done",
        "x-other-release",
        "w-failed",
    ]
    assert ids_of(statuses=()) == []
    assert ids_of(release_id="rel-2") == ["x-other-release"]
    assert ids_of(release_id="rel-1") == ["z-done", "y-open", "w-failed"]
    assert ids_of(reported_only=True) == ["z-done", "x-other-release"]
    assert ids_of(since=created[2]) == ids[2:4]
    assert ids_of(until=created[2]) == ids[:2]
    assert ids_of(since=created[1], until=created[3]) == ids[1:3]
    assert ids_of(after_seq=every[1].record.seq) == ids[2:4]
    assert ids_of(release_id="rel-1", reported_only=True, statuses={RecordStatus.COMPLETE}) == ["z-done"]
    assert [item.record.id for item in store.iter_records(OTHER)] == ["far"]
    assert list(store.iter_records("nobody")) == []


def test_iter_records_newest_first_walks_back_from_the_newest_with_the_same_filters(store: ExperienceStore) -> None:
    other_release = ReleaseRef("rel-2", "content-2", "load-2")
    for i in range(7):
        store.put_record(replace(pending(f"r{i}"), release=other_release if i % 3 == 0 else RELEASE))
    store.put_record(pending("far", scenario=OTHER))
    store.put_report(report(["r5", "r2"], rid="p1"))

    def ids_of(**filters: Any) -> list[str]:
        return [item.record.id for item in store.iter_records(SCENARIO, newest_first=True, **filters)]

    assert ids_of() == ["r6", "r5", "r4", "r3", "r2", "r1", "r0"]
    assert ids_of(page_size=2) == ids_of(page_size=500)
    assert ids_of(release_id="rel-2", page_size=2) == ["r6", "r3", "r0"]
    assert ids_of(reported_only=True, page_size=1) == ["r5", "r2"]
    first = next(store.iter_records(SCENARIO))
    assert ids_of(after_seq=first.record.seq, page_size=3) == ["r6", "r5", "r4", "r3", "r2", "r1"]
    newest = next(store.iter_records(SCENARIO, newest_first=True, page_size=1))
    assert newest.record.id == "r6" and [r.id for r in newest.reports] == []
    assert [r.id for r in next(iter(store.iter_records(SCENARIO, newest_first=True, reported_only=True))).reports] == [
        "p1"
    ]
    assert list(store.iter_records("nobody", newest_first=True)) == []


def test_iter_records_holds_nothing_between_pages(store: ExperienceStore) -> None:
    for i in range(3):
        store.put_record(pending(f"r{i}"))
    seen = []
    for item in store.iter_records(SCENARIO, page_size=1):
        seen.append(item.record.id)
        if len(seen) == 1:  # a write between pages neither blocks nor is blocked
            within(10, lambda: store.put_record(pending("late")))
    assert seen == ["r0", "r1", "r2", "late"]


# -- concurrency -------------------------------------------------------------------------


def test_concurrent_inserts_all_land_with_distinct_seqs(open_store: Opener) -> None:
    fronts = [open_store(), open_store()]

    def insert(worker: int) -> list[int]:
        s = fronts[worker % 2]
        return [s.put_record(pending(f"w{worker}-{i}")).seq or 0 for i in range(50)]

    with ThreadPoolExecutor(8) as pool:
        seqs = [seq for batch in pool.map(insert, range(8)) for seq in batch]
    assert len(set(seqs)) == 400 and 0 not in seqs
    assert fronts[0].count_records() == 400


def race(fronts: list[ExperienceStore], records: list[Record]) -> list[Record | Exception]:
    """Put each record from its own thread, released together."""
    barrier = threading.Barrier(len(records))

    def put(i: int) -> Record | Exception:
        barrier.wait()
        try:
            return fronts[i % len(fronts)].put_record(records[i])
        except RecordConflict as exc:
            return exc

    with ThreadPoolExecutor(len(records)) as pool:
        return list(pool.map(put, range(len(records))))


def test_racing_identical_puts_all_succeed_with_one_row(open_store: Opener) -> None:
    fronts = [open_store(), open_store()]
    results = race(fronts, [full("same")] * 8)
    assert all(isinstance(r, Record) for r in results)
    assert len({r.seq for r in results if isinstance(r, Record)}) == 1
    assert fronts[0].count_records() == 1


def test_racing_different_puts_let_exactly_one_win(open_store: Opener) -> None:
    fronts = [open_store(), open_store()]
    results = race(fronts, [pending("same", request={"n": i}) for i in range(8)])
    winners = [r for r in results if isinstance(r, Record)]
    assert len(winners) == 1 and sum(isinstance(r, RecordConflict) for r in results) == 7
    assert same(fronts[1].get_record("same"), winners[0])
    assert fronts[0].count_records() == 1


def test_a_reader_following_the_cursor_misses_no_report(open_store: Opener) -> None:
    """Reports become visible in sequence order, so a cursor never steps over a late commit."""
    fronts = [open_store(), open_store()]
    fronts[0].put_record(pending("a"))
    seen: list[str] = []

    def write(worker: int) -> list[str]:
        return [fronts[worker % 2].put_report(report(["a"])).id for _ in range(15)]

    def drain(cursor: int) -> int:
        for got in fronts[1].reported_since(SCENARIO, cursor):
            seen.append(got.report.id)
            cursor = got.cursor
        return cursor

    with ThreadPoolExecutor(6) as pool:
        batches = [pool.submit(write, w) for w in range(6)]
        cursor = 0
        while not all(b.done() for b in batches):
            cursor = drain(cursor)
    drain(cursor)
    written = [rid for b in batches for rid in b.result()]
    assert len(seen) == len(written) == 90 and sorted(seen) == sorted(written)


# -- postgres only -----------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_unreachable_is_storage_unavailable() -> None:
    pytest.importorskip("psycopg")
    from reef.observe.postgres_store import PostgresStore

    with pytest.raises(StorageUnavailable):
        PostgresStore("host=127.0.0.1 port=1 user=postgres dbname=postgres connect_timeout=2")


@pytest.mark.postgres
def test_postgres_refuses_a_newer_schema_and_reopens_an_older_one(postgres_dsn: str) -> None:  # noqa: F811
    import psycopg

    from reef.observe.postgres_store import PostgresStore

    schema = f"t_{uuid4().hex[:12]}"
    with PostgresStore(postgres_dsn, schema=schema) as first:
        first.put_record(pending("kept"))
    with PostgresStore(postgres_dsn, schema=schema) as again:
        assert again.get_record("kept").id == "kept"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StorageUnavailable, match="newer"):
        PostgresStore(postgres_dsn, schema=schema)


@pytest.mark.postgres
def test_postgres_recovers_from_dropped_connections(postgres_dsn: str) -> None:  # noqa: F811
    import psycopg

    from reef.observe.postgres_store import PostgresStore

    with PostgresStore(postgres_dsn, schema=f"t_{uuid4().hex[:12]}", pool_size=4) as store:
        race([store], [pending(f"warm-{i}") for i in range(4)])  # fill the pool with idle connections
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            killed = admin.execute(  # waits up to 5 s for each backend to be gone
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchall()
        assert killed and all(ok for (ok,) in killed)
        assert store.put_record(pending("after")).seq is not None
        assert store.count_records() == 5


@pytest.mark.postgres
def test_postgres_front_ends_may_create_a_schema_together(postgres_dsn: str) -> None:  # noqa: F811
    from reef.observe.postgres_store import PostgresStore

    schema = f"t_{uuid4().hex[:12]}"
    barrier = threading.Barrier(4)

    def open_one(_: int) -> PostgresStore:
        barrier.wait()
        return PostgresStore(postgres_dsn, schema=schema, pool_size=2)

    with ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(open_one, range(4)))
    stores[0].put_record(pending("r1"))
    assert all(s.count_records() == 1 for s in stores)
    for s in stores:
        s.close()


def test_the_harness_entry_round_trips_and_is_part_of_the_content(store: ExperienceStore) -> None:
    added = {
        "mode": "inject",
        "content_id": "sha256:" + "a" * 64,
        "skills": ["empty-token"],
        "inserted": True,
        "prefix_chars": 42,
    }
    stored = store.put_record(pending("r-h", harness=added))
    assert store.get_record("r-h").harness == added and same(store.get_record("r-h"), stored)
    with pytest.raises(RecordConflict):
        store.put_record(pending("r-h", harness={**added, "skills": []}))
    assert "harness" not in pending("r-plain").content()  # records without one keep their content hash
