"""Importing records users already have: `POST /reef/records/batch` and `reef import`.

A real server (a child process, the scripted upstream as its provider), real SQLite; the store
part (`put_batch`) on SQLite and on a real PostgreSQL (tests/pg.py).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from uuid import uuid4

import httpx
import pytest
from click.testing import CliRunner

from reef.cli import main
from reef.core.errors import RecordConflict
from reef.core.types import Record, RecordStatus, Report, ReportedRecords
from reef.grow.recipe import LearnerView
from reef.observe.sqlite_store import SQLiteStore
from reef.observe.store import ExperienceStore
from reef.recipes.proposers.distill import DistillProposer
from reef.recipes.sao import SAOConfig, SAORecipe
from reef.recipes.skills import SkillsConfig, SkillsRecipe
from tests.helpers.reef_server import ReefServer
from tests.pg import postgres_dsn  # noqa: F401  (session fixture used by the postgres param)
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "import-token-8c2f"
AUTH = {"authorization": f"Bearer {TOKEN}"}
SCENARIO = "imports"
SMALL_BODY = 64 * 1024  # the module server's max_body_bytes: its batch route takes 16 times that


def openai_item(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "dialect": "openai",
        "scenario": SCENARIO,
        "request": {"model": "gpt-x", "messages": [{"role": "user", "content": f"question {n}"}]},
        "response": {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "model": "gpt-x",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": f"answer {n}"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        },
        **extra,
    }


def anthropic_item(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "dialect": "anthropic",
        "scenario": SCENARIO,
        "request": {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": f"ask {n}"}]},
        "response": {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [{"type": "text", "text": f"reply {n}"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 4, "output_tokens": 2},
        },
        **extra,
    }


@pytest.fixture(scope="module")
def reef(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings = {**server_settings(upstream), "max_body_bytes": SMALL_BODY}
    with ReefServer(tmp_path_factory.mktemp("reef-import"), settings) as server:
        yield server


def server_settings(upstream: ScriptedUpstream) -> dict[str, Any]:
    return {
        "tokens": [TOKEN],
        "recipes": {"default": "skills"},
        "learner": {"enabled": False},
        "upstream": {"url": upstream.base_url, "model": "provider-model", "timeout": 5},
    }


@pytest.fixture
def http(reef: ReefServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=reef.url, headers=AUTH, timeout=60) as client:
        yield client


def records_of(http: httpx.Client, scenario: str = SCENARIO) -> int:
    answer = http.get(f"/reef/scenarios/{scenario}")
    return answer.json()["records"] if answer.status_code == 200 else 0


# -- the route -------------------------------------------------------------------------------


def test_a_batch_is_stored_as_served_records_marked_imported_with_receipts(
    http: httpx.Client, upstream: ScriptedUpstream
) -> None:
    first, second = f"imp-{uuid4().hex[:8]}", f"imp-{uuid4().hex[:8]}"
    items = [
        openai_item(1, id=first, score=1.0, feedback="right", session="s-1", tags={"source": "logs"}),
        anthropic_item(2, id=second, score=0.0, feedback={"why": "wrong"}),
        openai_item(3),
    ]
    answer = http.post("/reef/records/batch", json={"records": items})
    assert answer.status_code == 200, answer.text
    receipts = answer.json()["receipts"]
    assert [r["index"] for r in receipts] == [0, 1, 2]
    assert [r["record_id"] for r in receipts[:2]] == [first, second]
    assert receipts[2]["report_id"] is None and receipts[0]["report_id"] and receipts[1]["report_id"]

    got = http.get(f"/reef/records/{first}").json()
    record = got["record"]
    assert record["imported"] is True and record["release"] is None
    assert record["status"] == "complete" and record["token_ids"] is None and record["logprobs"] is None
    assert record["session"] == "s-1" and record["tags"] == {"source": "logs"}
    assert record["response"]["text"] == "answer 1" and record["response"]["usage"]["completion_tokens"] == 2
    assert [(r["score"], r["feedback"]) for r in got["reports"]] == [(1.0, "right")]
    anthropic = http.get(f"/reef/records/{second}").json()
    assert anthropic["record"]["request"]["dialect"] == "anthropic"
    assert anthropic["record"]["response"]["text"] == "reply 2"
    assert anthropic["reports"][0]["feedback"] == {"why": "wrong"}

    # the same request served by Reef is recorded in the same shape
    upstream.clear()
    served = http.post("/v1/chat/completions", json=items[0]["request"], headers={"x-reef-scenario": SCENARIO})
    assert served.status_code == 200, served.text
    live = http.get(f"/reef/records/{served.headers['x-reef-agent-record-id']}").json()["record"]
    assert live["request"] == record["request"]
    assert set(live["response"]) == set(record["response"])
    assert "imported" not in live


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"dialect": "gemini"}, "records[1].dialect"),
        ({"request": {"model": "m", "messages": "hi"}}, "records[1].request"),
        ({"response": {"choices": []}}, "records[1].response"),
        ({"response": {"choices": [{"message": {"content": 5}}]}}, "records[1].response"),
        ({"score": None, "feedback": "why"}, "records[1].feedback"),
        ({"id": "no spaces allowed"}, "records[1].id"),
        ({"scenario": "../etc"}, "records[1].scenario"),
        ({"extra": 1}, "records[1].extra"),
    ],
)
def test_a_bad_item_is_named_and_nothing_of_the_batch_is_stored(
    http: httpx.Client, bad: dict[str, Any], named: str
) -> None:
    before = records_of(http)
    good = f"good-{uuid4().hex[:8]}"
    items = [openai_item(1, id=good, score=1.0), {**openai_item(2), **bad}, openai_item(3)]
    answer = http.post("/reef/records/batch", json={"records": items})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith(named + ":"), answer.json()
    assert http.get(f"/reef/records/{good}").status_code == 404
    assert records_of(http) == before


def test_a_batch_of_none_or_over_a_thousand_or_not_json_is_refused(http: httpx.Client) -> None:
    for body in ({"records": []}, {"records": [openai_item(i) for i in range(1001)]}, {}):
        answer = http.post("/reef/records/batch", json=body)
        assert answer.status_code == 400, answer.text
        assert "records" in answer.json()["error"]["message"]
    bad = http.post("/reef/records/batch", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]


def test_a_retry_answers_the_same_receipts_and_other_content_under_an_id_conflicts_storing_nothing(
    http: httpx.Client,
) -> None:
    ids = [f"again-{uuid4().hex[:8]}" for _ in range(3)]
    batch = {"records": [openai_item(i, id=rid, score=float(i)) for i, rid in enumerate(ids)]}
    first = http.post("/reef/records/batch", json=batch)
    assert first.status_code == 200, first.text
    before = records_of(http)
    again = http.post("/reef/records/batch", json=batch)
    assert again.status_code == 200 and again.json() == first.json()
    assert records_of(http) == before

    fresh = f"fresh-{uuid4().hex[:8]}"
    changed = {"records": [openai_item(9, id=fresh), openai_item(1, id=ids[1], score=1.0)]}
    changed["records"][1]["response"]["choices"][0]["message"]["content"] = "another answer"
    answer = http.post("/reef/records/batch", json=changed)
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["message"].startswith("records[1].id:")
    rescored = {"records": [openai_item(9, id=fresh), openai_item(2, id=ids[2], score=0.5)]}
    answer = http.post("/reef/records/batch", json=rescored)
    assert answer.status_code == 409 and answer.json()["error"]["message"].startswith("records[1].score:")
    assert http.get(f"/reef/records/{fresh}").status_code == 404
    assert records_of(http) == before


def test_the_route_needs_the_token(reef: ReefServer) -> None:
    answer = httpx.post(f"{reef.url}/reef/records/batch", json={"records": [openai_item(1)]})
    assert answer.status_code == 401


def test_the_batch_route_takes_sixteen_times_the_body_limit_and_no_more(http: httpx.Client) -> None:
    def batch(filler: int) -> dict[str, Any]:
        items = [openai_item(i) for i in range(1000)]
        for item in items:
            item["request"]["messages"][0]["content"] += "x" * filler
            del item["scenario"]  # the x-reef-scenario header's, then
        return {"records": items}

    fits, too_big = batch(200), batch(1200)
    assert SMALL_BODY < len(json.dumps(fits)) < 16 * SMALL_BODY < len(json.dumps(too_big))
    answer = http.post("/reef/records/batch", json=too_big, headers={"x-reef-scenario": "big"})
    assert answer.status_code == 413 and "16 times max_body_bytes" in answer.json()["error"]["message"]
    assert records_of(http, "big") == 0
    answer = http.post("/reef/records/batch", json=fits, headers={"x-reef-scenario": "big"})
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["imported"] == 1000 and records_of(http, "big") == 1000
    assert (
        http.post("/reef/report", json={"references": ["x"], "score": 1, "feedback": "y" * SMALL_BODY}).status_code
        == 413
    )


def test_a_server_killed_during_a_batch_keeps_all_of_it_or_none(upstream: ScriptedUpstream, tmp_path: Path) -> None:
    """SIGKILL while the batch's transaction is being written (its write-ahead log growing):
    after a restart the batch is wholly absent (or, had the commit won the race, wholly there)."""
    ids = [f"kill-{i}" for i in range(1000)]
    items = [openai_item(i, id=rid, score=1.0, scenario="killed") for i, rid in enumerate(ids)]
    for item in items:
        item["request"]["messages"][0]["content"] += "y" * 5000
    first = ReefServer(tmp_path, server_settings(upstream)).start()
    wal = first.state_dir / "experience.db-wal"
    start_size = wal.stat().st_size if wal.exists() else 0
    answers: list[Any] = []

    def send() -> None:
        try:
            answers.append(
                httpx.post(f"{first.url}/reef/records/batch", json={"records": items}, headers=AUTH, timeout=60)
            )
        except httpx.HTTPError as exc:
            answers.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    deadline = time.monotonic() + 30
    while not answers and time.monotonic() < deadline:
        if wal.exists() and wal.stat().st_size > start_size + 1024 * 1024:
            break
        time.sleep(0.001)
    first.kill()
    first.stop()
    sender.join(timeout=30)
    assert answers and isinstance(answers[0], httpx.HTTPError), "the kill came after the answer"
    with SQLiteStore(first.state_dir / "experience.db") as store:  # what a restarted server opens
        kept = store.count_records("killed")
        assert kept in (0, len(ids)), f"{kept} of {len(ids)} records survived: a torn batch"
        assert store.count_reports("killed") == kept  # each item has its report
        items_again = [(imported(f"kill-{i}"), None) for i in range(3)] if not kept else []
        assert len(store.put_batch(items_again)) == len(items_again)  # the store takes writes again


def test_export_then_import_round_trips(reef: ReefServer, upstream: ScriptedUpstream, tmp_path: Path) -> None:
    """`reef export records` of a served, scored scenario, `reef import` into another server,
    and its export again: the same lines but for what serving elsewhere changes (the release,
    when it was stored)."""
    runner = CliRunner()
    with httpx.Client(base_url=reef.url, headers={**AUTH, "x-reef-scenario": "trip"}, timeout=30) as http:
        for i in range(3):
            served = http.post(
                "/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i}"}],
                },
                headers={"x-reef-session": "sess-a", "x-reef-tag-team": "blue"},
            )
            assert served.status_code == 200, served.text
            receipt = served.headers["x-reef-agent-record-id"]
            if i < 2:
                assert (
                    http.post(
                        "/reef/report", json={"references": [receipt], "score": i, "feedback": f"f{i}"}
                    ).status_code
                    == 200
                )
    exported = tmp_path / "trip.jsonl"
    done = runner.invoke(
        main, ["export", "records", "trip", "--state-dir", str(reef.state_dir), "--out", str(exported)]
    )
    assert done.exit_code == 0, done.output
    with ReefServer(tmp_path / "target", server_settings(upstream)) as second:
        done = runner.invoke(main, ["import", str(exported), "--url", second.url, "--token", TOKEN])
        assert done.exit_code == 0, done.output
        assert "imported 3 record(s)" in done.output
        again = runner.invoke(main, ["import", str(exported), "--url", second.url, "--token", TOKEN])
        assert again.exit_code == 0, again.output  # a retry stores nothing twice
        with httpx.Client(base_url=second.url, headers=AUTH, timeout=30) as http:
            assert records_of(http, "trip") == 3
    round_trip = tmp_path / "again.jsonl"
    done = runner.invoke(
        main, ["export", "records", "trip", "--state-dir", str(tmp_path / "target" / "state"), "--out", str(round_trip)]
    )
    assert done.exit_code == 0, done.output

    def comparable(path: Path) -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows:
            del row["metadata"]["release_id"], row["metadata"]["created_at"]
        return rows

    assert comparable(round_trip) == comparable(exported)
    assert [row["score"] for row in comparable(exported)] == [0.0, 1.0, None]


def test_import_names_the_line_a_refused_batch_stopped_at(reef: ReefServer, tmp_path: Path) -> None:
    lines = [
        {
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "score": 1.0,
            "feedback": ["ok"],
            "metadata": {"scenario": SCENARIO},
        },
        {"messages": [{"role": "user", "content": "q"}], "metadata": {}},
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    done = CliRunner().invoke(main, ["import", str(path), "--url", reef.url, "--token", TOKEN])
    assert done.exit_code == 1 and "line 2: the last message is not the assistant's answer" in done.output
    path.write_text(
        json.dumps(lines[0])
        + "\n"
        + json.dumps({**lines[0], "messages": [{"role": "wizard", "content": "q"}, lines[0]["messages"][1]]})
        + "\n"
    )
    done = CliRunner().invoke(main, ["import", str(path), "--url", reef.url, "--token", TOKEN])
    assert done.exit_code == 1 and "line 2 was refused, with the batch of lines 1-2 (none of it stored)" in done.output


# -- what learns from them -------------------------------------------------------------------


def test_sao_drops_an_imported_record_by_its_reason_and_the_harness_recipe_learns_from_it() -> None:
    async def no_files() -> dict[str, bytes]:
        return {}

    def view() -> LearnerView:
        return LearnerView(SCENARIO, set(), lambda release_id: 0, lambda: None, no_files)  # type: ignore[arg-type,return-value]

    record = Record(
        "imp-1", SCENARIO, None, {"messages": [{"role": "user", "content": "q"}]}, RecordStatus.COMPLETE,
        response={"text": "a long answer"}, imported=True,
    )  # fmt: skip
    scored = ReportedRecords(Report("rep-1", SCENARIO, ("imp-1",), 0.0, "answer in one word", seq=1), (record,))
    sao, sao_view = SAORecipe(SAOConfig()), view()
    sao.intake([scored], sao_view)
    assert sao_view.dropped == {"imported": 1}
    config = SkillsConfig.model_validate({"gate": {"holdout_fraction": 0.0}})
    skills, skills_view = SkillsRecipe(config, proposer=DistillProposer(config)), view()
    skills.intake([scored], skills_view)
    assert not skills_view.dropped and [obs.record_id for obs in skills.failures] == ["imp-1"]


# -- the store -------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ExperienceStore]:
    if request.param == "sqlite":
        opened: ExperienceStore = SQLiteStore(tmp_path / "experience.db")
    else:
        from reef.observe.postgres_store import PostgresStore

        opened = PostgresStore(request.getfixturevalue("postgres_dsn"), schema=f"t_{uuid4().hex[:12]}")
    yield opened
    opened.close()


def imported(rid: str, text: str = "a") -> Record:
    return Record(
        rid, SCENARIO, None, {"messages": [{"role": "user", "content": rid}]}, RecordStatus.COMPLETE,
        response={"text": text}, imported=True,
    )  # fmt: skip


def test_put_batch_stores_all_or_none_and_a_retry_is_idempotent(store: ExperienceStore) -> None:
    items = [(imported(f"b{i}"), Report(f"rep-b{i}", SCENARIO, (f"b{i}",), float(i))) for i in range(3)]
    stored = store.put_batch(items)
    assert [r.id for r, _ in stored] == ["b0", "b1", "b2"] and all(p is not None for _, p in stored)
    assert store.put_batch(items) == stored
    assert store.get_record("b1").imported

    clash = [(imported("c0"), None), (imported("b1", text="other"), None), (imported("c2"), None)]
    with pytest.raises(RecordConflict, match=r"^records\[1\]\.id: "):
        store.put_batch(clash)
    assert store.count_records(SCENARIO) == 3  # c0 was undone with the rest
    assert store.count_reports(SCENARIO) == 3
