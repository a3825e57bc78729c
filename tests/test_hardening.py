"""Defects found by trying to break Reef as a hostile or careless client would (docs/RELIABILITY.md,
"Hardening"): hung-up and stalled streams, oversized and deeply nested input, tag headers,
lax types, trailing newlines in ids, receipts on failures, and what `verified` means upstream.
Each test failed before its fix."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from reef.core.errors import StorageUnavailable
from reef.core.types import Record, ReleaseRef
from reef.observe.sqlite_store import SQLiteStore
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "hardening-token-5d1e"
AUTH = {"authorization": f"Bearer {TOKEN}"}
SEND_TIMEOUT = 1.0
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def reef(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings = {
        "tokens": [TOKEN],
        "recipes": {"default": "skills"},
        "limits": {"stream_send_timeout": SEND_TIMEOUT},
        "upstream": {"url": upstream.base_url, "model": "provider-model", "timeout": 5},
    }
    with ReefServer(tmp_path_factory.mktemp("reef-hardening"), settings) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_script(upstream: ScriptedUpstream) -> None:
    upstream.clear()


@pytest.fixture
def http(reef: ReefServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=reef.url, headers=AUTH, timeout=20) as client:
        yield client


def poll(condition: Callable[[], Any], what: str, deadline_s: float = 15.0) -> Any:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {deadline_s} s")


def record_of(http: httpx.Client, receipt: str) -> dict[str, Any]:
    answer = http.get(f"/reef/records/{receipt}")
    assert answer.status_code == 200, answer.text
    return answer.json()["record"]


def in_flight(http: httpx.Client) -> int:
    return http.get("/reef/status").json()["serving"]["in_flight"]


# -- 1. a client that hangs up must never stop the store's writer ----------------------------


def _record(record_id: str) -> Record:
    return Record(id=record_id, scenario="s", release=ReleaseRef("r" * 40, "c" * 64, 0), request={"messages": []})


def test_the_writer_survives_a_caller_cancelled_while_its_write_waits(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "experience.db")
    gate = threading.Event()
    try:
        blocker: Future[Any] = store._enqueue(lambda conn: gate.wait(10), single_statement=True)  # noqa: SLF001

        async def cancelled_caller() -> None:
            task = asyncio.ensure_future(store.aput_record(_record("cancelled-1")))
            await asyncio.sleep(0.05)  # queued behind the blocker
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled_caller())
        gate.set()
        blocker.result(timeout=10)
        assert store.put_record(_record("after-1")).id == "after-1"  # hung forever before the fix
        assert store.health() is None
    finally:
        gate.set()
        store.close()


def test_one_callers_failing_statement_fails_only_that_caller(tmp_path: Path) -> None:
    """A statement error (not a full disk) used to roll back every write grouped with it."""
    store = SQLiteStore(tmp_path / "experience.db")
    gate = threading.Event()
    try:
        blocker = store._enqueue(lambda conn: gate.wait(10), single_statement=True)  # noqa: SLF001
        innocent = [store._enqueue(store._put_record_write(_record(f"innocent-{i}")), True) for i in range(3)]  # noqa: SLF001
        bad = store._enqueue(lambda conn: conn.execute("SELECT * FROM no_such_table"), False)  # noqa: SLF001
        late = store._enqueue(store._put_record_write(_record("innocent-late")), True)  # noqa: SLF001
        gate.set()
        blocker.result(timeout=10)
        assert [f.result(timeout=10).id for f in innocent] == ["innocent-0", "innocent-1", "innocent-2"]
        with pytest.raises(StorageUnavailable, match="no_such_table"):
            bad.result(timeout=10)
        assert late.result(timeout=10).id == "innocent-late"
        assert store.count_records() == 4
    finally:
        gate.set()
        store.close()


def test_a_stopped_writer_fails_writes_at_once_and_the_health_check(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "experience.db")
    store._queue.put(_stop_marker())  # noqa: SLF001 - the writer thread ends as a dead one would
    store._writer.join(timeout=10)  # noqa: SLF001
    try:
        assert store.health() is not None and "writer" in store.health()
        with pytest.raises(StorageUnavailable, match="writer thread has stopped"):
            store.put_record(_record("never"))
    finally:
        store.close()


def _stop_marker() -> object:
    from reef.observe import sqlite_store

    return sqlite_store._STOP  # noqa: SLF001


def test_healthz_fails_when_the_store_cannot_write(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    from fastapi.testclient import TestClient

    from reef.config import ServeConfig
    from reef.runtimes.upstream import UpstreamRuntime
    from reef.serve.app import create_app

    config = ServeConfig(state_dir=tmp_path / "state", upstream={"url": upstream.base_url})
    app = create_app(config, UpstreamRuntime(upstream.base_url))
    with TestClient(app, base_url="http://127.0.0.1") as client:  # a loopback Host: the server has no token
        assert client.get("/healthz").status_code == 200
        store = app.state.reef.store
        store._queue.put(_stop_marker())  # noqa: SLF001 - the writer thread ends as a dead one would
        store._writer.join(timeout=10)  # noqa: SLF001
        answer = client.get("/healthz")
        assert answer.status_code == 503 and "writer" in answer.json()["reason"]


async def _hang_up_after_one_chunk(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str:
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        async for _ in response.aiter_raw():
            break
        return response.headers["x-reef-agent-record-id"]


def test_streams_whose_clients_hang_up_never_stop_later_writes(reef: ReefServer, http: httpx.Client) -> None:
    """The reproduction: 50 concurrent streams whose clients read one chunk and close, ten
    rounds; after each, a plain request is answered and every record ends finished."""
    stream_bodies = [
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/messages", {**CHAT, "max_tokens": 16, "stream": True}),
    ]

    async def one_round() -> list[str]:
        limits = httpx.Limits(max_connections=60)
        async with httpx.AsyncClient(base_url=reef.url, headers=AUTH, timeout=20, limits=limits) as client:
            return await asyncio.gather(*(_hang_up_after_one_chunk(client, *stream_bodies[i % 2]) for i in range(50)))

    receipts: list[str] = []
    for _ in range(10):
        receipts += asyncio.run(one_round())
        plain = http.post("/v1/chat/completions", json=CHAT, timeout=10)  # hung forever before the fix
        assert plain.status_code == 200
    poll(lambda: in_flight(http) == 0, "streams still in flight")
    statuses = {record_of(http, r)["status"] for r in receipts}
    assert statuses <= {"complete", "incomplete"}, statuses
    assert http.get("/healthz").status_code == 200


# -- 2. one oversized report must not fail other clients --------------------------------------


def test_a_report_naming_too_many_receipts_is_a_400_and_others_are_unharmed(
    reef: ReefServer, http: httpx.Client
) -> None:
    receipt = f"f{time.monotonic_ns() % 10_000}"  # short, so 260,000 of them fit the body limit
    assert http.post("/v1/chat/completions", json=CHAT, headers={"x-reef-agent-record-id": receipt}).status_code == 200

    def flood() -> httpx.Response:
        return httpx.post(
            f"{reef.url}/reef/report", headers=AUTH, timeout=20, json={"references": [receipt] * 260_000, "score": 1}
        )

    with httpx.Client(base_url=reef.url, headers=AUTH, timeout=20) as other:
        results: dict[str, Any] = {}
        flooder = threading.Thread(target=lambda: results.update(flood=flood()))
        flooder.start()
        innocent = [other.post("/reef/report", json={"references": [receipt], "score": 0.5}) for _ in range(5)]
        flooder.join()
    assert results["flood"].status_code == 400 and "max_report_references" in results["flood"].text
    assert [r.status_code for r in innocent] == [200] * 5


def test_the_store_checks_a_report_of_many_receipts_in_chunks(tmp_path: Path) -> None:
    from reef.core.types import Report

    with SQLiteStore(tmp_path / "experience.db") as store:
        ids = [f"many-{i}" for i in range(1200)]
        for i in ids:
            store.put_record(_record(i))
        stored = store.put_report(Report(id="r1", scenario="s", references=tuple(ids * 220), score=1.0))
        # 264,000 references, past SQLite's 250,000 bound variables ("too many SQL variables"); each receipt counts once
        assert stored.references == tuple(ids)


# -- 3 and 4. nesting: never a record that cannot be read back, never a 500 -------------------


def _nested(depth: int) -> Any:
    value: Any = {"type": "string"}
    for _ in range(depth):
        value = {"type": "object", "properties": {"x": value}}
    return value


def test_deeply_nested_free_form_json_is_refused_before_it_is_stored(http: httpx.Client) -> None:
    tool = {"type": "function", "function": {"name": "deep", "parameters": _nested(130)}}
    refused = http.post(
        "/v1/chat/completions", json={**CHAT, "tools": [tool]}, headers={"x-reef-agent-record-id": "deep-tool-1"}
    )
    assert refused.status_code == 400 and "max_json_depth" in refused.json()["error"]["message"]
    assert http.get("/reef/records/deep-tool-1").status_code == 404

    receipt = http.post("/v1/chat/completions", json=CHAT).headers["x-reef-agent-record-id"]
    refused = http.post("/reef/report", json={"references": [receipt], "score": 1, "metadata": _nested(130)})
    assert refused.status_code == 400 and "metadata" in refused.text
    fine = http.post(
        "/v1/chat/completions",
        json={**CHAT, "tools": [{"type": "function", "function": {"name": "ok", "parameters": _nested(20)}}]},
    )
    assert fine.status_code == 200
    assert http.get(f"/reef/records/{fine.headers['x-reef-agent-record-id']}").status_code == 200


def test_a_stored_record_deeper_than_the_encoder_limit_reads_back(tmp_path: Path) -> None:
    """Records stored before the input limit existed still read back (no 500)."""
    from fastapi.testclient import TestClient

    from reef.config import ServeConfig
    from reef.runtimes.upstream import UpstreamRuntime
    from reef.serve.app import create_app

    config = ServeConfig(state_dir=tmp_path / "state")
    app = create_app(config, UpstreamRuntime("http://127.0.0.1:9"))
    with TestClient(app, base_url="http://127.0.0.1") as client:  # a loopback Host: the server has no token
        deep = Record(
            id="deep-old",
            scenario="default",
            release=ReleaseRef("r" * 40, "c" * 64, 0),
            request={"messages": [], "tools": [{"name": "t", "parameters": _nested(300)}]},
        )
        app.state.reef.store.put_record(deep)
        answer = client.get("/reef/records/deep-old")
        assert answer.status_code == 200 and answer.json()["record"]["id"] == "deep-old"


BODY_ROUTES = [
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/reef/report",
    "/reef/scenarios",
    "/reef/scenarios/default/rollback",
]


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_ten_thousand_nested_arrays_are_a_400_in_the_clients_dialect(http: httpx.Client, path: str) -> None:
    answer = http.post(path, content=b"[" * 10_000 + b"]" * 10_000, headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    error = answer.json()
    if path.startswith("/v1/messages"):
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    else:
        assert error["error"]["type"] == "invalid_request_error"
    assert http.post("/v1/chat/completions", json=CHAT).status_code == 200  # the same keep-alive connection


# -- 5. a client that stops reading cannot hold its stream ------------------------------------


def test_a_client_that_stops_reading_loses_its_stream_within_the_send_timeout(
    reef: ReefServer, http: httpx.Client, upstream: ScriptedUpstream
) -> None:
    upstream.script(mode="huge", size=12 * 1024 * 1024)  # far more than the socket buffers hold
    body = json.dumps({**CHAT, "stream": True}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect(("127.0.0.1", reef.port))
    try:
        reader.sendall(head + body)
        first = reader.recv(4096).decode("latin-1")
        receipt = first.split("x-reef-agent-record-id: ", 1)[1].split("\r\n", 1)[0]
        record = poll(
            lambda: (r := record_of(http, receipt))["status"] != "in_progress" and r,
            "the stalled stream's record is still in_progress",
            SEND_TIMEOUT + 15,
        )
        assert record["status"] == "incomplete" and "stream_send_timeout" in record["error"]
        poll(lambda: in_flight(http) == 0, "the stalled stream is still in flight")
    finally:
        reader.close()


# -- 6. tag headers are bounded --------------------------------------------------------------


def test_tag_headers_are_bounded(http: httpx.Client) -> None:
    huge = {f"x-reef-tag-t{i}": "v" * 100_000 for i in range(80)}
    refused = http.post("/v1/chat/completions", json=CHAT, headers=huge)
    assert refused.status_code == 431 and "max_header_bytes" in refused.text
    assert refused.headers["content-type"].startswith("text/plain")  # the HTTP protocol refused it, before the app
    many = {f"x-reef-tag-t{i}": "v" for i in range(33)}
    assert http.post("/v1/chat/completions", json=CHAT, headers=many).status_code == 400
    long_value = {"x-reef-tag-team": "v" * 1025}
    refused = http.post("/v1/chat/completions", json=CHAT, headers={**long_value, "x-reef-agent-record-id": "tag-1"})
    assert refused.status_code == 400 and "max_tag_bytes" in refused.text
    assert http.get("/reef/records/tag-1").status_code == 404
    fine = http.post("/v1/chat/completions", json=CHAT, headers={"x-reef-tag-team": "infra"})
    assert record_of(http, fine.headers["x-reef-agent-record-id"])["tags"] == {"team": "infra"}


# -- 9 and 10. types, ids, receipts on failures, verified ------------------------------------


@pytest.mark.parametrize("score", ["1", True, None, "NaN"])
def test_a_report_score_of_the_wrong_type_is_a_400(http: httpx.Client, score: Any) -> None:
    receipt = http.post("/v1/chat/completions", json=CHAT).headers["x-reef-agent-record-id"]
    before = len(http.get(f"/reef/records/{receipt}").json()["reports"])
    assert http.post("/reef/report", json={"references": [receipt], "score": score}).status_code == 400
    assert len(http.get(f"/reef/records/{receipt}").json()["reports"]) == before


def test_names_and_ids_with_a_trailing_newline_are_refused(http: httpx.Client) -> None:
    assert http.post("/reef/scenarios", json={"name": "made\n"}).status_code == 400
    assert "made\n" not in [s["name"] for s in http.get("/reef/scenarios").json()["scenarios"]]
    receipt = http.post("/v1/chat/completions", json=CHAT).headers["x-reef-agent-record-id"]
    assert (
        http.post("/reef/report", json={"references": [receipt], "score": 1, "report_id": "rep\n"}).status_code == 400
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_502_carries_the_receipt_of_its_incomplete_record(
    http: httpx.Client, upstream: ScriptedUpstream, stream: bool
) -> None:
    upstream.script(status=500, error="provider exploded")
    failed = http.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert failed.status_code == 502
    receipt = failed.headers["x-reef-agent-record-id"]
    assert record_of(http, receipt)["status"] == "incomplete"
    assert http.post("/reef/report", json={"references": [receipt], "score": 0}).status_code == 200


def test_verified_means_the_same_in_a_stream_and_in_status(http: httpx.Client) -> None:
    """An upstream gives no token ids, so nothing it answers is verified: the stream says so
    and `/reef/status` counts it."""
    before = http.get("/reef/status").json()["provenance"]
    assert before["runtime_verifies_tokens"] is False
    with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        text = "".join(response.iter_text())
    closing = json.loads([line for line in text.splitlines() if '"reef"' in line][-1].removeprefix("data: "))
    assert closing["reef"]["verified"] is False
    after = http.get("/reef/status").json()["provenance"]
    assert after["unverified_records"] == before["unverified_records"] + 1
