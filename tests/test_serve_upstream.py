"""`reef serve` in front of a scripted upstream provider (a real HTTP server), driven by the
official OpenAI and Anthropic SDKs: receipts, reports, streaming, tool calls, the error
contract (400, 401, 404, 409, 413, 502) and durability of a receipt under `kill -9`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import anthropic
import httpx
import openai
import pytest

from reef.client import ReefClient, ReefClientError
from reef.commit.state import ReefState
from reef.core.types import RecordStatus
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "test-token-7f3a9c"
USER = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def reef(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings = {
        "tokens": [TOKEN, "rotated-token-2"],
        "max_body_bytes": 64 * 1024,
        "upstream": {
            "url": upstream.base_url,
            "model": "provider-model",
            "api_key": "sk-upstream-secret",
            "timeout": 3,
        },
        "recipes": {"default": "skills", "scenarios": {"weights": "sao"}},
    }
    with ReefServer(tmp_path_factory.mktemp("reef"), settings) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_script(upstream: ScriptedUpstream) -> None:
    upstream.clear()


@pytest.fixture
def oai(reef: ReefServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=reef.base_url, api_key=TOKEN, max_retries=0, timeout=20)


@pytest.fixture
def ant(reef: ReefServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=reef.url, api_key=TOKEN, max_retries=0, timeout=20)


@pytest.fixture
def client(reef: ReefServer) -> Iterator[ReefClient]:
    with ReefClient(reef.url, TOKEN) as c:
        yield c


def test_openai_answer_carries_a_receipt_that_can_be_reported(
    oai: openai.OpenAI, client: ReefClient, upstream: ScriptedUpstream
) -> None:
    upstream.script(text="General Kenobi")
    raw = oai.chat.completions.with_raw_response.create(model="gpt-4o", messages=USER)
    completion = raw.parse()
    receipt = raw.headers["x-reef-agent-record-id"]
    assert completion.choices[0].message.content == "General Kenobi"
    assert completion.model == "gpt-4o"  # the name the client asked for
    assert upstream.requests[-1].body["model"] == "provider-model"
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-upstream-secret"
    record = client.record(receipt)["record"]
    assert record["status"] == "complete" and record["scenario"] == "default"
    assert record["release"]["release_id"] == raw.headers["x-reef-release-id"]
    assert record["response"]["text"] == "General Kenobi" and record["request"]["model"] == "gpt-4o"
    reported = client.report(receipt, score=1.0, feedback="spot on")
    assert reported["scenario"] == "default"
    assert client.record(receipt)["reports"][0]["feedback"] == "spot on"


def test_openai_stream_ends_with_the_reef_chunk(
    oai: openai.OpenAI, client: ReefClient, upstream: ScriptedUpstream
) -> None:
    upstream.script(text="one two three four")
    raw = oai.chat.completions.with_raw_response.create(
        model="m", messages=USER, stream=True, extra_headers={"x-reef-session": "sess-1"}
    )
    receipt = raw.headers["x-reef-agent-record-id"]
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reef_chunk = [c for c in chunks if not c.choices and getattr(c, "reef", None)]
    assert text == "one two three four"
    assert reef_chunk and reef_chunk[-1].reef["agent_record_id"] == receipt
    record = client.record(receipt)["record"]
    assert record["status"] == "complete" and record["session"] == "sess-1"
    client.report(score=0.5, session="sess-1")
    assert len(client.record(receipt)["reports"]) == 1


def test_anthropic_messages_plain_and_streaming(
    ant: anthropic.Anthropic, client: ReefClient, upstream: ScriptedUpstream
) -> None:
    upstream.script(text="plain answer")
    raw = ant.messages.with_raw_response.create(model="claude-x", max_tokens=50, messages=USER, system="be brief")
    message = raw.parse()
    assert message.content[0].text == "plain answer"
    sent = upstream.requests[-1].body
    assert sent["messages"][0]["role"] == "system"  # translated into the OpenAI upstream's shape
    upstream.script(text="streamed answer here")
    with ant.messages.stream(model="claude-x", max_tokens=50, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed answer here" and final.stop_reason == "end_turn"
    assert client.record(raw.headers["x-reef-agent-record-id"])["record"]["status"] == "complete"


def test_tool_calls_reach_both_sdks(oai: openai.OpenAI, ant: anthropic.Anthropic, upstream: ScriptedUpstream) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    upstream.script(tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}])
    completion = oai.chat.completions.create(model="m", messages=USER, tools=[tool])
    call = completion.choices[0].message.tool_calls[0]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    upstream.script(tool_calls=[{"name": "get_weather", "arguments": {"city": "Oslo"}}])
    message = ant.messages.create(
        model="m",
        max_tokens=64,
        messages=USER,
        tools=[{"name": "get_weather", "input_schema": tool["function"]["parameters"]}],
    )
    block = next(b for b in message.content if b.type == "tool_use")
    assert message.stop_reason == "tool_use" and block.input == {"city": "Oslo"}


def test_tokens_are_required_except_on_healthz(reef: ReefServer) -> None:
    assert httpx.get(f"{reef.url}/healthz").status_code == 200
    for path in ("/v1/models", "/reef/status", "/reef/scenarios", "/metrics"):
        assert httpx.get(f"{reef.url}{path}").status_code == 401
        assert httpx.get(f"{reef.url}{path}", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{reef.url}{path}", headers={"authorization": "Bearer rotated-token-2"}).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=reef.base_url, api_key="nope", max_retries=0).chat.completions.create(
            model="m", messages=USER
        )
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=reef.url, api_key="nope", max_retries=0).messages.create(
            model="m", max_tokens=5, messages=USER
        )
    assert TOKEN not in reef.logs()


def test_bad_input_gets_a_400_in_each_dialect_and_stores_nothing(reef: ReefServer, client: ReefClient) -> None:
    before = client.status()["storage"]["records"]
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    oai_bad = httpx.post(f"{reef.base_url}/chat/completions", content=b"{not json", headers=headers)
    assert oai_bad.status_code == 400 and "message" in oai_bad.json()["error"]
    ant_bad = httpx.post(f"{reef.base_url}/messages", json={"model": "m", "messages": USER}, headers=headers)
    assert ant_bad.status_code == 400 and ant_bad.json()["type"] == "error"
    assert "max_tokens" in ant_bad.json()["error"]["message"]
    n2 = httpx.post(f"{reef.base_url}/chat/completions", json={"model": "m", "messages": USER, "n": 2}, headers=headers)
    assert n2.status_code == 400 and "n" in n2.json()["error"]["message"]
    assert client.status()["storage"]["records"] == before


def test_reports_refuse_unknown_receipts_and_non_finite_scores(
    reef: ReefServer, oai: openai.OpenAI, client: ReefClient
) -> None:
    with pytest.raises(ReefClientError) as unknown:
        client.report("no-such-receipt", score=1.0)
    assert unknown.value.status == 404
    receipt = oai.chat.completions.with_raw_response.create(model="m", messages=USER).headers["x-reef-agent-record-id"]
    bad = httpx.post(
        f"{reef.url}/reef/report",
        content=b'{"references": ["%s"], "score": NaN}' % receipt.encode(),
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    assert bad.status_code == 400
    assert client.record(receipt)["reports"] == []


def test_binding_conflicts_are_409s_that_change_nothing(oai: openai.OpenAI, client: ReefClient) -> None:
    oai.chat.completions.create(model="m", messages=USER, extra_headers={"x-reef-scenario": "bound"})
    with pytest.raises(openai.ConflictError):
        oai.chat.completions.create(
            model="m", messages=USER, extra_headers={"x-reef-scenario": "bound", "x-reef-recipe": "sao"}
        )
    with pytest.raises(openai.ConflictError):
        oai.chat.completions.create(
            model="m", messages=USER, extra_headers={"x-reef-scenario": "bound", "x-reef-release-id": "f" * 40}
        )
    with pytest.raises(openai.ConflictError):  # a new scenario whose config binds another recipe
        oai.chat.completions.create(
            model="m", messages=USER, extra_headers={"x-reef-scenario": "weights", "x-reef-recipe": "skills"}
        )
    assert "weights" not in [s["name"] for s in client.scenarios()]
    assert client.scenario("bound")["records"] == 1


def test_a_client_chosen_receipt_makes_retries_idempotent(
    oai: openai.OpenAI, client: ReefClient, upstream: ScriptedUpstream
) -> None:
    upstream.script(text="first answer")
    headers = {"x-reef-agent-record-id": "retry-me-1"}
    first = oai.chat.completions.create(model="m", messages=USER, extra_headers=headers)
    again = oai.chat.completions.create(model="m", messages=USER, extra_headers=headers)
    assert again.choices[0].message.content == first.choices[0].message.content == "first answer"
    assert len(upstream.requests) == 1
    with pytest.raises(openai.ConflictError):
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "other"}], extra_headers=headers)


def test_oversize_bodies_get_413(reef: ReefServer) -> None:
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 100_000}]}
    response = httpx.post(f"{reef.base_url}/chat/completions", json=big, headers={"authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 413


def test_upstream_failures_are_502s_and_incomplete_records(
    oai: openai.OpenAI, ant: anthropic.Anthropic, client: ReefClient, upstream: ScriptedUpstream
) -> None:
    upstream.script(status=500, error="provider exploded")
    with pytest.raises(openai.InternalServerError) as failed:
        oai.chat.completions.with_raw_response.create(model="m", messages=USER)
    assert failed.value.status_code == 502
    upstream.script(status=400, error="your prompt is bad")
    with pytest.raises(anthropic.BadRequestError, match="your prompt is bad"):
        ant.messages.create(model="m", max_tokens=5, messages=USER)
    upstream.script(mode="stop_midstream", text="half of an answer that stops")
    stream = oai.chat.completions.with_raw_response.create(model="m", messages=USER, stream=True)
    receipt = stream.headers["x-reef-agent-record-id"]
    with pytest.raises(openai.APIError):
        list(stream.parse())
    record = client.record(receipt)["record"]
    assert record["status"] == "incomplete" and record["error"]


def test_models_scenarios_releases_and_rollback(oai: openai.OpenAI, client: ReefClient) -> None:
    assert [m.id for m in oai.models.list()] == ["provider-model"]
    oai.chat.completions.create(model="m", messages=USER, extra_headers={"x-reef-scenario": "rb"})
    first = client.releases("rb")["releases"][0]
    back = client.rollback("rb", first["release_id"])
    assert back["release"]["step"] == 2 and back["release"]["content_id"] == first["content_id"]
    listed = client.releases("rb")["releases"]
    assert [r["step"] for r in listed] == [2, 1] and listed[0]["current"]
    with pytest.raises(ReefClientError) as stale:
        client.rollback("rb", first["release_id"], expected_head=first["release_id"])
    assert stale.value.status == 409


def test_metrics_count_requests(reef: ReefServer, oai: openai.OpenAI) -> None:
    oai.chat.completions.create(model="m", messages=USER, extra_headers={"x-reef-scenario": "metered"})
    text = httpx.get(f"{reef.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
    assert 'reef_requests_total{route="chat_completions",scenario="metered",status="200"} 1.0' in text


def _status_after_kill_9(
    upstream: ScriptedUpstream, tmp_path: Path, receive: Callable[[ReefServer], str]
) -> RecordStatus:
    """Start a server, let `receive` get a receipt (it SIGKILLs the server itself, at the point
    it tests), and read the receipt's record back from the state directory."""
    server = ReefServer(tmp_path, {"upstream": {"url": upstream.base_url, "model": "p"}}).start()
    try:
        receipt = receive(server)
    finally:
        server.stop()
    with ReefState.open(server.state_dir) as state:
        return state.store.get_record(receipt).status


def test_a_receipt_survives_kill_9_right_after_the_response(upstream: ScriptedUpstream, tmp_path: Path) -> None:
    def receive(server: ReefServer) -> str:
        raw = openai.OpenAI(
            base_url=server.base_url, api_key="x", max_retries=0
        ).chat.completions.with_raw_response.create(model="m", messages=USER)
        server.kill()
        return raw.headers["x-reef-agent-record-id"]

    assert _status_after_kill_9(upstream, tmp_path, receive) is RecordStatus.COMPLETE


def test_a_stream_receipt_survives_kill_9_right_after_its_headers(upstream: ScriptedUpstream, tmp_path: Path) -> None:
    """The runtime starts while the in_progress record is written; the headers (the receipt)
    must still wait for that write (invariant 1)."""
    upstream.script(text="a b c d e f g h", mode="slow", delay=2.0)  # the rest comes much later

    def receive(server: ReefServer) -> str:
        body = {"model": "m", "messages": USER, "stream": True}
        with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, timeout=30) as response:
            server.kill()
            return response.headers["x-reef-agent-record-id"]

    # the record exists; the process that could finish it is gone, so reopening marked it incomplete
    assert _status_after_kill_9(upstream, tmp_path, receive) is RecordStatus.INCOMPLETE


def test_a_client_that_goes_away_leaves_an_incomplete_record(
    reef: ReefServer, client: ReefClient, upstream: ScriptedUpstream
) -> None:
    import time

    upstream.script(text="a b c d e f g h i j k l m n o p", mode="slow", delay=0.2)
    body = {"model": "m", "messages": USER, "stream": True}
    with httpx.stream(
        "POST", f"{reef.base_url}/chat/completions", json=body, headers={"authorization": f"Bearer {TOKEN}"}
    ) as response:
        receipt = response.headers["x-reef-agent-record-id"]
        next(response.iter_bytes())  # the first chunk, then hang up
    deadline = time.monotonic() + 15
    while (record := client.record(receipt)["record"])["status"] == "in_progress" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert record["status"] == "incomplete" and "disconnected" in record["error"]
