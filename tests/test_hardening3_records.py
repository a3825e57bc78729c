"""Records cut by a crash (Hardening 3, item 10): a record left `in_progress` by a process that
died is marked `incomplete` by the next store opened on the same data, never one a live process
may still finish; a retry under the same client-chosen receipt then runs again in its place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterator
from uuid import uuid4

import httpx
import openai
import pytest

from reef.core.errors import NotFound, RecordConflict
from reef.core.types import Record, RecordStatus, ReleaseRef, Report
from reef.observe.instances import INTERRUPTED
from reef.observe.sqlite_store import SQLiteStore
from reef.observe.store import ExperienceStore
from tests.helpers.reef_server import ROOT, ReefServer
from tests.pg import postgres_dsn  # noqa: F401  (session fixture used by the postgres params)
from tests.scripted_upstream import ScriptedUpstream

USER = [{"role": "user", "content": "tell me a long story"}]
RELEASE = ReleaseRef("rel-1", "content-1", "load-1")
Opener = Callable[[], ExperienceStore]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(python expression opening a store, its kind): the same data from any process."""
    if request.param == "sqlite":
        yield f"SQLiteStore({str(tmp_path / 'experience.db')!r})", "sqlite"
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        yield f"PostgresStore({dsn!r}, schema={'t_' + uuid4().hex[:12]!r})", "postgres"


def opener(expression: str) -> Callable[[], ExperienceStore]:
    from reef.observe.postgres_store import PostgresStore

    return lambda: eval(expression, {"SQLiteStore": SQLiteStore, "PostgresStore": PostgresStore})


def pending(rid: str, session: str | None = None) -> Record:
    return Record(rid, "cut", RELEASE, {"messages": [{"role": "user", "content": rid}]}, session=session)


class WriterProcess:
    """Another process with the store open, one record `in_progress` written, then idle."""

    def __init__(self, expression: str, record_id: str) -> None:
        code = textwrap.dedent(f"""
            import sys, time
            from reef.observe.sqlite_store import SQLiteStore
            from reef.observe.postgres_store import PostgresStore
            from reef.core.types import Record, ReleaseRef
            store = {expression}
            store.put_record(Record({record_id!r}, "cut", ReleaseRef("rel-1", "content-1", "load-1"),
                                    {{"messages": [{{"role": "user", "content": {record_id!r}}}]}}))
            print("WRITTEN", flush=True)
            time.sleep(600)
        """)
        self.child = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        assert self.child.stdout is not None
        line = self.child.stdout.readline()
        assert line.strip() == "WRITTEN", f"the writer process failed ({self.child.wait()})"

    def kill(self) -> None:
        self.child.send_signal(signal.SIGKILL)
        self.child.wait(timeout=30)


def test_a_live_processs_record_is_left_alone_and_a_killed_ones_is_marked(backend: tuple[str, str]) -> None:
    expression, _ = backend
    writer = WriterProcess(expression, "live-1")
    try:
        with opener(expression)() as store:  # opening is recovery: the writer is alive, so nothing moves
            assert store.get_record("live-1").status is RecordStatus.IN_PROGRESS
    finally:
        writer.kill()
    with opener(expression)() as store:
        record = store.get_record("live-1")
        assert record.status is RecordStatus.INCOMPLETE and record.error == INTERRUPTED
        assert record.request == pending("live-1").request and record.release == RELEASE  # content kept


def test_a_record_of_this_store_is_never_taken_for_a_dead_ones(backend: tuple[str, str]) -> None:
    expression, _ = backend
    open_store = opener(expression)
    with open_store() as first:
        first.put_record(pending("mine-1"))
        with open_store() as second:  # another front end opens: the first still lives
            assert second.get_record("mine-1").status is RecordStatus.IN_PROGRESS
        done = first.finish_record("mine-1", RecordStatus.COMPLETE, response={"text": "whole"})
        assert done.status is RecordStatus.COMPLETE


@pytest.mark.postgres
def test_a_front_end_whose_lock_connection_died_takes_its_lock_again(postgres_dsn: str) -> None:  # noqa: F811
    """A database restart drops every connection, the one holding the instance's lock too; the
    instance takes it again within a second, so another front end opening after that leaves its
    live records alone."""
    import psycopg

    from reef.observe.postgres_store import PostgresStore

    schema = f"t_{uuid4().hex[:12]}"
    with PostgresStore(postgres_dsn, schema=schema) as first:
        first.put_record(pending("live-across-1"))
        old_pid = first.instances._conn.info.backend_pid
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
            deadline = time.monotonic() + 10
            while not _holds_advisory_lock_other_than(admin, old_pid, first.instances.key(first.instances.id)):
                assert time.monotonic() < deadline, "the instance never took its lock again"
                time.sleep(0.05)
        with PostgresStore(postgres_dsn, schema=schema) as second:
            assert second.get_record("live-across-1").status is RecordStatus.IN_PROGRESS
        assert first.finish_record("live-across-1", RecordStatus.COMPLETE).status is RecordStatus.COMPLETE


def _holds_advisory_lock_other_than(admin: Any, old_pid: int, key: str) -> bool:
    row = admin.execute(  # a bigint key is held as (classid, objid): its high and low 32 bits
        "SELECT l.pid FROM pg_locks l, (SELECT hashtextextended(%s, 0) AS k) h WHERE l.locktype = 'advisory'"
        " AND l.granted AND l.objsubid = 1 AND l.classid::text::bigint = (h.k >> 32) & 4294967295"
        " AND l.objid::text::bigint = h.k & 4294967295",
        (key,),
    ).fetchone()
    return row is not None and row[0] != old_pid


def test_records_a_store_before_version_2_left_in_progress_are_marked_on_upgrade(tmp_path: Path) -> None:
    import sqlite3

    from reef.observe import rules
    from reef.observe.sqlite_store import SCHEMA

    path = tmp_path / "experience.db"
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(SCHEMA)  # version 1: no owner column
    old.execute("PRAGMA user_version=1")
    old.execute(
        "INSERT INTO records (id, scenario, session, status, body, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        ("legacy-1", "cut", None, "in_progress", rules.record_body(pending("legacy-1")), time.time()),
    )
    old.close()
    with SQLiteStore(path) as store:
        assert store.get_record("legacy-1").status is RecordStatus.INCOMPLETE
        store.put_record(pending("new-1"))  # the upgraded table takes new records
        assert store.get_record("new-1").status is RecordStatus.IN_PROGRESS


# -- a retry under the receipt of an incomplete record -----------------------------------


def test_replace_incomplete_takes_the_place_of_a_failed_attempt_only(backend: tuple[str, str]) -> None:
    expression, _ = backend
    with opener(expression)() as store:
        store.put_record(pending("failed-1", session="s1"))
        failed = store.finish_record("failed-1", RecordStatus.INCOMPLETE, error="upstream 502")
        again = Record("failed-1", "cut", ReleaseRef("rel-2", "content-2"), pending("failed-1").request, session="s1")
        replaced = store.replace_incomplete(again)
        assert replaced.seq == failed.seq
        stored = store.get_record("failed-1")
        assert stored.status is RecordStatus.IN_PROGRESS and stored.release == again.release and stored.error is None
        with pytest.raises(RecordConflict, match="still being answered"):
            store.replace_incomplete(again)
        store.finish_record("failed-1", RecordStatus.COMPLETE, response={"text": "ok"})
        with pytest.raises(RecordConflict, match="already complete"):
            store.replace_incomplete(again)

        store.put_record(pending("reported-1"))
        store.finish_record("reported-1", RecordStatus.INCOMPLETE, error="upstream 502")
        store.put_report(Report(uuid4().hex, "cut", ("reported-1",), 0.0))
        with pytest.raises(RecordConflict, match="a report names it"):
            store.replace_incomplete(pending("reported-1"))

        store.put_record(pending("other-1", session="s1"))
        store.finish_record("other-1", RecordStatus.INCOMPLETE, error="x")
        with pytest.raises(RecordConflict, match="other content"):
            store.replace_incomplete(pending("other-1", session="s2"))
        with pytest.raises(NotFound):
            store.replace_incomplete(pending("never-1"))
        assert store.get_record("other-1").error == "x"


# -- end to end: a real server killed mid-stream ----------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(record=False) as up:
        yield up


def settings(upstream: ScriptedUpstream) -> dict[str, Any]:
    return {"recipes": {"default": "skills"}, "upstream": {"url": upstream.base_url, "model": "p", "timeout": 60}}


def test_a_stream_cut_by_sigkill_is_incomplete_after_restart_and_its_retry_answers(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    upstream.clear()
    upstream.script(text="the first half of a story that never ends", mode="stall_midstream")
    body = {"model": "m", "messages": USER, "stream": True}
    receipt = {"x-reef-agent-record-id": "cut-by-kill-1"}
    reef = ReefServer(tmp_path, settings(upstream)).start()
    try:
        with (
            httpx.Client(base_url=reef.url, timeout=30) as http,
            http.stream("POST", "/v1/chat/completions", json=body, headers=receipt) as stream,
        ):
            assert stream.status_code == 200
            chunks = stream.iter_bytes()  # held: a dropped iterator closes the stream when collected
            next(chunks)  # the first bytes are out: the record is durable, in progress
            assert http.get("/reef/records/cut-by-kill-1").json()["record"]["status"] == "in_progress"
            reef.kill()
            del chunks
    finally:
        reef.stop()
    with ReefServer(tmp_path, settings(upstream)) as again, httpx.Client(base_url=again.url, timeout=30) as http:
        record = http.get("/reef/records/cut-by-kill-1").json()["record"]
        assert (record["status"], record["error"]) == ("incomplete", INTERRUPTED)
        other = http.post(
            "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "else"}]}, headers=receipt
        )
        assert other.status_code == 409 and "another request" in other.text
        retry = http.post("/v1/chat/completions", json=body, headers=receipt)  # the same request again
        assert retry.status_code == 200 and retry.headers["x-reef-agent-record-id"] == "cut-by-kill-1"
        assert "echo: tell me a long story" in retry.text
        deadline = time.monotonic() + 10
        while (record := http.get("/reef/records/cut-by-kill-1").json()["record"])["status"] == "in_progress":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert record["status"] == "complete" and record["error"] is None
        replay = http.post("/v1/chat/completions", json=body, headers=receipt)  # complete now: replayed
        assert replay.status_code == 200 and "echo: tell me a long story" in replay.text


def test_the_sdks_own_retry_after_a_502_gets_the_answer_and_a_reported_failure_stays(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    upstream.clear()
    with ReefServer(tmp_path, settings(upstream)) as reef:
        upstream.script(status=500, error="provider exploded")  # Reef answers 502; the SDK retries it
        oai = openai.OpenAI(base_url=reef.base_url, api_key="none", max_retries=2, timeout=30)
        answer = oai.chat.completions.create(
            model="m", messages=USER, extra_headers={"x-reef-agent-record-id": "sdk-retry-1"}
        )
        assert answer.choices[0].message.content == "echo: tell me a long story"
        with httpx.Client(base_url=reef.url, timeout=30) as http:
            assert http.get("/reef/records/sdk-retry-1").json()["record"]["status"] == "complete"

            upstream.script(status=500, error="provider exploded")
            headers = {"x-reef-agent-record-id": "reported-failure-1"}
            failed = http.post("/v1/chat/completions", json={"model": "m", "messages": USER}, headers=headers)
            assert failed.status_code == 502
            assert http.post("/reef/report", json={"references": ["reported-failure-1"], "score": 0}).status_code == 200
            refused = http.post("/v1/chat/completions", json={"model": "m", "messages": USER}, headers=headers)
            assert refused.status_code == 409
            assert "a report names it" in refused.text and "new x-reef-agent-record-id" in refused.text
            assert http.get("/reef/records/reported-failure-1").json()["record"]["status"] == "incomplete"
