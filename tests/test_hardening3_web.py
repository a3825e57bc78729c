"""Hardening 3, the web side (docs/RELIABILITY.md): what a web page the operator opens could make
the browser send to a token-less Reef (cross-site forgeries, a DNS-rebinding Host), a report that
names one receipt a thousand times, and a records view over a large quiet scenario. Each test
failed before its fix; the official SDKs and Reef's own client show nothing legitimate broke."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from reef.client import ReefClient
from reef.core.types import Record, RecordStatus, ReleaseRef
from reef.observe import rules
from reef.observe.sqlite_store import SQLiteStore
from reef.serve import routes_records
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "hardening3-token-8e2a"
EVIL = "http://evil.example"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def open_reef(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    """No token: the default on loopback."""
    settings = {"learner": {"enabled": False}, "upstream": {"url": upstream.base_url, "model": "provider-model"}}
    with ReefServer(tmp_path_factory.mktemp("reef-open"), settings) as server:
        yield server


@pytest.fixture(scope="module")
def tokened_reef(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings = {
        "tokens": [TOKEN],
        "learner": {"enabled": False},
        "upstream": {"url": upstream.base_url, "model": "provider-model"},
    }
    with ReefServer(tmp_path_factory.mktemp("reef-tokened"), settings) as server:
        yield server


def receipt_of(reef: ReefServer) -> str:
    answer = httpx.post(f"{reef.base_url}/chat/completions", json={"model": "m", "messages": USER}, timeout=20)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-reef-agent-record-id"]


def state_of(reef: ReefServer, upstream: ScriptedUpstream) -> dict[str, Any]:
    """Everything a forged request could change: heads, counts, scenarios, the provider's calls."""
    status = httpx.get(f"{reef.url}/reef/status", timeout=10).json()["storage"]
    scenarios = httpx.get(f"{reef.url}/reef/scenarios", timeout=10).json()["scenarios"]
    return {
        "records": status["records"],
        "reports": status["reports"],
        "upstream_calls": len(upstream.requests),
        "scenarios": {s["name"]: (s["step"], s["head"]["release_id"]) for s in scenarios},
    }


def forgeries(receipt: str, head: str) -> list[tuple[str, str]]:
    """The issue's reproductions: (path, body) as a page of another site can post them."""
    spend = [{"role": "user", "content": "spend"}]
    return [
        (path, json.dumps(body))
        for path, body in [
            ("/reef/scenarios/default/rollback", {"release_id": head}),
            ("/reef/report", {"references": [receipt], "score": -1}),
            ("/v1/chat/completions", {"model": "m", "messages": spend}),
            ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": spend}),
            ("/reef/scenarios", {"name": "planted"}),
        ]
    ]


# -- cross-site requests on a token-less server ------------------------------------------------------


@pytest.mark.parametrize(
    "headers, status",
    [
        ({"origin": EVIL, "content-type": "text/plain"}, 403),  # a form-like post from another site
        ({"origin": EVIL, "content-type": "application/json"}, 403),
        ({"sec-fetch-site": "cross-site", "content-type": "application/json"}, 403),
        ({"sec-fetch-site": "same-site", "content-type": "application/json"}, 403),  # another port of localhost
        ({"origin": "null", "content-type": "application/json"}, 403),  # a sandboxed frame
        ({"content-type": "text/plain"}, 415),  # no fetch metadata at all (an old browser's form)
        ({"content-type": "application/x-www-form-urlencoded"}, 415),
        ({}, 415),
    ],
    ids=["origin-text", "origin-json", "cross-site", "same-site", "null-origin", "text", "form", "no-type"],
)
def test_a_forged_post_is_refused_in_the_clients_dialect_and_changes_nothing(
    open_reef: ReefServer, upstream: ScriptedUpstream, headers: dict[str, str], status: int
) -> None:
    receipt = receipt_of(open_reef)
    head = httpx.get(f"{open_reef.url}/reef/scenarios/default", timeout=10).json()["head"]["release_id"]
    before = state_of(open_reef, upstream)
    for path, body in forgeries(receipt, head):
        answer = httpx.post(f"{open_reef.url}{path}", content=body.encode(), headers=headers, timeout=10)
        assert answer.status_code == status, (path, answer.status_code, answer.text)
        error = answer.json()
        if path == "/v1/messages":
            assert error["type"] == "error" and error["error"]["message"]  # Anthropic's shape
        else:
            assert set(error) == {"error"} and error["error"]["message"]
    assert state_of(open_reef, upstream) == before


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",
        "127.0.0.1.nip.io:{port}",
        "localhost.evil.example:{port}",
        "[::1]x",
        "localhost:",
    ],
)
def test_a_rebinding_host_reads_nothing(open_reef: ReefServer, host: str) -> None:
    receipt = receipt_of(open_reef)
    header = {"host": host.format(port=open_reef.port)}
    for path in (
        "/reef/scenarios/default/records?limit=50",
        f"/reef/records/{receipt}",
        "/reef/status",
        "/reef/scenarios",
        "/metrics",
        "/ui/",
    ):
        answer = httpx.get(f"{open_reef.url}{path}", headers=header, timeout=10)
        assert answer.status_code == 403, (host, path, answer.status_code)
        assert receipt not in answer.text and "Reef dashboard" not in answer.text


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST:{port}", "[::1]:{port}", "127.0.0.1", "127.1.2.3:{port}"],
)
def test_loopback_hosts_and_the_servers_own_pages_are_served(open_reef: ReefServer, host: str) -> None:
    receipt = receipt_of(open_reef)
    own = host.format(port=open_reef.port)
    records = httpx.get(f"{open_reef.url}/reef/scenarios/default/records?limit=5", headers={"host": own}, timeout=10)
    assert records.status_code == 200 and records.json()["records"][0]["id"] == receipt
    page = {"host": own, "origin": f"http://{own}", "sec-fetch-site": "same-origin"}  # what the dashboard sends
    report = httpx.post(
        f"{open_reef.url}/reef/report", json={"references": [receipt], "score": 1}, headers=page, timeout=10
    )
    assert report.status_code == 200, report.text
    linked = {"host": own, "sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"}  # a link to the dashboard
    assert httpx.get(f"{open_reef.url}/ui/", headers=linked, timeout=10).status_code == 200


def test_the_official_sdks_and_reefs_client_still_work_without_a_token(open_reef: ReefServer) -> None:
    oai = openai.OpenAI(base_url=open_reef.base_url, api_key="unused", max_retries=0, timeout=20)
    chat = oai.chat.completions.with_raw_response.create(model="m", messages=USER)  # type: ignore[arg-type]
    assert chat.status_code == 200
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in oai.chat.completions.create(model="m", messages=USER, stream=True)
        if chunk.choices
    )  # type: ignore[arg-type]
    assert streamed
    assert oai.responses.create(model="m", input="hi").output_text
    claude = anthropic.Anthropic(base_url=open_reef.url, api_key="unused", max_retries=0, timeout=20)
    assert claude.messages.create(model="m", max_tokens=8, messages=USER).content  # type: ignore[arg-type]
    assert claude.messages.count_tokens(model="m", messages=USER).input_tokens > 0  # type: ignore[arg-type]
    with ReefClient(open_reef.url) as client:
        client.report(chat.headers["x-reef-agent-record-id"], score=1.0, feedback="fine")
        created = client.create_scenario("sdk-made")
        client.rollback("sdk-made", created["head"]["release_id"])
        assert client.scenario("sdk-made")["step"] == created["step"] + 1
    utf8 = httpx.post(
        f"{open_reef.url}/reef/report",
        content=b'{"references": ["%s"], "score": 0.5}' % chat.headers["x-reef-agent-record-id"].encode(),
        headers={"content-type": "Application/JSON; charset=utf-8"},
        timeout=10,
    )
    assert utf8.status_code == 200, utf8.text


def test_with_a_token_bodies_must_be_json_and_the_token_check_comes_first(tokened_reef: ReefServer) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    chat = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    unsigned = httpx.post(
        f"{tokened_reef.base_url}/chat/completions", content=chat, headers={"content-type": "text/plain"}, timeout=10
    )
    assert unsigned.status_code == 401
    plain = httpx.post(
        f"{tokened_reef.base_url}/chat/completions",
        content=chat,
        headers={**auth, "content-type": "text/plain"},
        timeout=10,
    )
    assert plain.status_code == 415 and plain.json()["error"]["type"] == "invalid_request_error"
    assert "application/json" in plain.json()["error"]["message"]
    # with a token the browser cannot forge, another Host or Origin stays the operator's business
    elsewhere = httpx.post(
        f"{tokened_reef.base_url}/chat/completions",
        content=chat,
        timeout=10,
        headers={**auth, "content-type": "application/json", "origin": EVIL, "host": "reef.example.com"},
    )
    assert elsewhere.status_code == 200, elsewhere.text


# -- duplicate references ------------------------------------------------------------------------------


def test_a_report_naming_one_receipt_a_thousand_times_stores_it_once(open_reef: ReefServer) -> None:
    first, second = receipt_of(open_reef), receipt_of(open_reef)
    named = [first] * 999 + [second]
    answer = httpx.post(f"{open_reef.url}/reef/report", json={"references": named, "score": 1}, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json()["references"] == [first, second]
    [stored] = httpx.get(f"{open_reef.url}/reef/records/{first}", timeout=10).json()["reports"]
    assert stored["references"] == [first, second]
    store = SQLiteStore(open_reef.state_dir / "experience.db")
    try:
        [reported] = [r for r in store.reported_since("default") if r.report.id == stored["id"]]
        assert [r.id for r in reported.records] == [first, second]  # what a learner's intake takes
    finally:
        store.close()


# -- the records view over a large quiet scenario ----------------------------------------------------

MANY = 50_000


def insert_old_records(path: Path, scenario: str, count: int) -> None:
    """`count` records of `scenario`, all two days old, written straight into the store's file."""
    old = time.time() - 2 * 86400
    release = ReleaseRef("rel-old", "content-old", "load-old")

    def row(i: int) -> tuple[Any, ...]:
        record = Record(
            f"old{i:07d}",
            scenario,
            release,
            {"messages": [{"role": "user", "content": f"q{i}"}]},
            status=RecordStatus.COMPLETE,
            response={"text": f"a{i}"},
        )
        return record.id, scenario, None, "complete", rules.record_body(record), old + i * 1e-4, old + i * 1e-4

    with sqlite3.connect(path, timeout=30) as conn:
        conn.executemany(
            "INSERT INTO records (id, scenario, session, status, body, created_at, finished_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (row(i) for i in range(count)),
        )


def test_the_newest_records_of_a_large_quiet_scenario_cost_only_what_is_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "experience.db"
    SQLiteStore(path).close()  # the schema
    insert_old_records(path, "quiet", MANY)
    store = SQLiteStore(path)
    try:
        decoded: list[int] = []
        real = rules.record_from_row
        monkeypatch.setattr(rules, "record_from_row", lambda body, seq: decoded.append(seq) or real(body, seq))
        statements: list[str] = []
        store._reader().set_trace_callback(statements.append)  # the SQL this thread's reads run
        started = time.perf_counter()
        page = routes_records.listing(store, "quiet", 50, None)
        older = routes_records.listing(store, "quiet", 50, None, before_seq=page["next_before_seq"])  # the next page
        took = time.perf_counter() - started
        store._reader().set_trace_callback(None)
        assert [r["id"] for r in page["records"] + older["records"]] == [
            f"old{i:07d}" for i in range(MANY - 1, MANY - 101, -1)
        ]
        assert len(decoded) == 2 * 51, f"decoded {len(decoded)} records to show 2 pages of 50"  # one more: a next page?
        assert took < 1.0, f"{took:.2f} s"
        reads = [s for s in statements if s.lstrip().upper().startswith("SELECT") and "FROM records" in s]
        assert reads
        for statement in reads:
            plan = " | ".join(row[3] for row in store._reader().execute(f"EXPLAIN QUERY PLAN {statement}"))
            assert "USING INDEX records_by_scenario" in plan and "TEMP B-TREE" not in plan, plan
    finally:
        store.close()


def test_a_polled_records_view_of_a_large_quiet_scenario_answers_at_once(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = {"learner": {"enabled": False}, "upstream": {"url": upstream.base_url, "model": "provider-model"}}
    with ReefServer(tmp_path, settings) as reef:
        asked = httpx.post(
            f"{reef.base_url}/chat/completions",
            json={"model": "m", "messages": USER},
            timeout=20,
            headers={"x-reef-scenario": "quiet"},
        )
        assert asked.status_code == 200
        db = reef.state_dir / "experience.db"
        with sqlite3.connect(db, timeout=30) as conn:  # quiet: nothing newer than a day
            conn.execute("UPDATE records SET created_at = created_at - 172800 WHERE scenario = 'quiet'")
        insert_old_records(db, "quiet", MANY)
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            answer = httpx.get(f"{reef.url}/reef/scenarios/quiet/records?limit=50", timeout=30)
            timings.append(time.perf_counter() - started)
            assert answer.status_code == 200 and len(answer.json()["records"]) == 50
        assert answer.json()["records"][0]["id"] == f"old{MANY - 1:07d}"
        assert sorted(timings)[2] < 0.5, timings  # the median; about 1 s before the fix at 50,000 (4 s at 200,000)
