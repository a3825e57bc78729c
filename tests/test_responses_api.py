"""`POST /v1/responses` (OpenAI's Responses API) through the official `openai` SDK against a real
`reef serve` in front of the scripted upstream: plain and streaming answers, the stream helper,
a function call round trip, receipts that can be reported, records, retries, refusals and the
error contract (400, 502, the in-stream error)."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest
from openai.types.responses import response_create_params

from reef.client import ReefClient
from reef.core.errors import InvalidInput
from reef.serve import responses_wire
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "responses-token-5e1d"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "Weather now", "parameters": WEATHER, "strict": False}
]
DOCS = Path(__file__).resolve().parent.parent / "docs" / "wire.md"


@pytest.fixture(scope="module")
def reef(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings = {
        "tokens": [TOKEN],
        "learner": {"enabled": False},
        "upstream": {"url": upstream.base_url, "model": "provider-model", "timeout": 3},
    }
    with ReefServer(tmp_path_factory.mktemp("reef-responses"), settings) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_script(upstream: ScriptedUpstream) -> None:
    upstream.clear()


@pytest.fixture
def oai(reef: ReefServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=reef.base_url, api_key=TOKEN, max_retries=0, timeout=20)


@pytest.fixture
def client(reef: ReefServer) -> Iterator[ReefClient]:
    with ReefClient(reef.url, TOKEN) as c:
        yield c


def test_a_plain_answer_carries_a_receipt_that_can_be_reported(
    reef: ReefServer, oai: openai.OpenAI, client: ReefClient, upstream: ScriptedUpstream
) -> None:
    upstream.script(text="General Kenobi", usage=(11, 3))
    raw = oai.responses.with_raw_response.create(
        model="gpt-4o",
        input="hello there",
        instructions="Be brief.",
        max_output_tokens=50,
        temperature=0.3,
        top_p=0.9,
        store=False,
    )
    response = raw.parse()
    receipt = raw.headers["x-reef-agent-record-id"]
    assert response.output_text == "General Kenobi" and response.status == "completed"
    assert response.object == "response" and response.model == "gpt-4o" and response.id == f"resp_{receipt}"
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (11, 3, 14)
    assert (response.instructions, response.max_output_tokens, response.temperature) == ("Be brief.", 50, 0.3)
    reef_receipt = response.model_extra["reef"]
    assert reef_receipt["agent_record_id"] == receipt and reef_receipt["release_id"] == raw.headers["x-reef-release-id"]
    assert reef_receipt["verified"] is False  # an upstream provider gives no token ids
    sent = upstream.requests[-1].body  # translated into the upstream's chat-completions shape
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    assert (sent["max_tokens"], sent["temperature"], sent["top_p"]) == (50, 0.3, 0.9)

    record = client.record(receipt)["record"]
    assert record["status"] == "complete" and record["request"]["dialect"] == "responses"
    assert record["request"]["model"] == "gpt-4o" and record["request"]["max_tokens"] == 50
    assert [m["role"] for m in record["request"]["messages"]] == ["system", "user"]
    assert record["response"]["text"] == "General Kenobi"
    client.report(receipt, score=1.0, feedback="spot on")
    assert client.record(receipt)["reports"][0]["feedback"] == "spot on"
    metrics = httpx.get(f"{reef.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
    assert 'reef_requests_total{route="responses",scenario="default",status="200"}' in metrics


def test_a_stream_sends_the_documented_events_and_ends_with_the_receipt(
    oai: openai.OpenAI, client: ReefClient, upstream: ScriptedUpstream
) -> None:
    upstream.script(text="one two three four")
    raw = oai.responses.with_raw_response.create(
        model="m",
        input=[{"role": "user", "content": "count"}],
        stream=True,
        extra_headers={"x-reef-session": "resp-sess"},
    )
    receipt = raw.headers["x-reef-agent-record-id"]
    events = list(raw.parse())
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1  # the upstream runtime may join deltas that arrive together
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1]
    assert text == "one two three four" == done.response.output_text
    assert done.response.status == "completed" and done.response.usage.total_tokens > 0
    assert done.model_extra["reef"]["agent_record_id"] == receipt
    assert done.response.model_extra["reef"]["agent_record_id"] == receipt
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {done.response.output[0].id}
    record = client.record(receipt)["record"]
    assert record["status"] == "complete" and record["session"] == "resp-sess"
    assert record["request"]["stream"] is True and record["response"]["text"] == text
    client.report(score=0.5, session="resp-sess")
    assert len(client.record(receipt)["reports"]) == 1


@pytest.mark.skipif(not hasattr(openai.OpenAI(api_key="x").responses, "stream"), reason="no responses.stream helper")
def test_the_sdk_stream_helper_gets_the_final_response(oai: openai.OpenAI, upstream: ScriptedUpstream) -> None:
    upstream.script(text="streamed answer here")
    with oai.responses.stream(model="m", input="hi", instructions="Be brief.") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == "streamed answer here" == final.output_text and final.status == "completed"
    assert final.model_extra["reef"]["agent_record_id"]


def test_a_function_call_round_trip(oai: openai.OpenAI, client: ReefClient, upstream: ScriptedUpstream) -> None:
    question = [{"role": "user", "content": "Weather in Paris?"}]
    upstream.script(tool_calls=[{"name": "get_weather", "arguments": {"city": "Paris"}}])
    first = oai.responses.create(model="m", input=question, tools=TOOLS, tool_choice="auto")
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id
    assert first.status == "completed" and first.output_text == ""
    assert first.tools[0].name == "get_weather" and first.tool_choice == "auto"
    sent = upstream.requests[-1].body
    assert (
        sent["tools"][0]["function"]["name"] == "get_weather" and sent["tools"][0]["function"]["parameters"] == WEATHER
    )

    upstream.script(text="It is sunny in Paris.")
    follow_up = [
        *question,
        *first.output,  # the SDK's own output items go back as input, as OpenAI documents
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'},
    ]
    raw = oai.responses.with_raw_response.create(model="m", input=follow_up, tools=TOOLS)
    second = raw.parse()
    assert second.output_text == "It is sunny in Paris."
    messages = upstream.requests[-1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == call.call_id
    assert messages[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": '{"sky": "sunny"}'}
    stored = client.record(raw.headers["x-reef-agent-record-id"])["record"]["request"]["messages"]
    assert stored[1]["tool_calls"][0]["id"] == call.call_id and stored[2]["tool_call_id"] == call.call_id


def test_a_streamed_function_call(oai: openai.OpenAI, upstream: ScriptedUpstream) -> None:
    upstream.script(
        tool_calls=[
            {"name": "get_weather", "arguments": {"city": "Oslo"}},
            {"name": "get_weather", "arguments": {"city": "Bergen"}},
        ]
    )
    events = list(
        oai.responses.create(
            model="m",
            input="Weather in Oslo and Bergen?",
            tools=TOOLS,
            tool_choice={"type": "function", "name": "get_weather"},
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    call_events = [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert kinds == ["response.created", "response.in_progress", *call_events, *call_events, "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [{"city": "Oslo"}, {"city": "Bergen"}]
    assert [e.output_index for e in done] == [0, 1]
    final = events[-1].response
    assert [json.loads(item.arguments)["city"] for item in final.output] == ["Oslo", "Bergen"]
    assert len({item.call_id for item in final.output}) == 2


def test_a_client_chosen_receipt_replays_the_recorded_answer(oai: openai.OpenAI, upstream: ScriptedUpstream) -> None:
    upstream.script(text="first answer")
    headers = {"x-reef-agent-record-id": "responses-retry-1"}
    first = oai.responses.create(model="m", input="hi", extra_headers=headers)
    again = oai.responses.create(model="m", input="hi", extra_headers=headers)
    assert again.output_text == first.output_text == "first answer"
    assert again.model_extra["reef"]["agent_record_id"] == "responses-retry-1"
    upstream.script(text="streamed once")
    headers = {"x-reef-agent-record-id": "responses-retry-2"}
    streamed = list(oai.responses.create(model="m", input="hi", stream=True, extra_headers=headers))
    replayed = list(oai.responses.create(model="m", input="hi", stream=True, extra_headers=headers))
    assert [e.type for e in replayed] == [e.type for e in streamed]
    assert replayed[-1].response.output_text == streamed[-1].response.output_text == "streamed once"
    assert len(upstream.requests) == 2
    with pytest.raises(openai.ConflictError):
        oai.responses.create(model="m", input="other", extra_headers=headers)


def test_refusals_and_bad_bodies_are_400s_that_store_nothing(
    reef: ReefServer, oai: openai.OpenAI, client: ReefClient
) -> None:
    before = client.status()["storage"]["records"]
    refused: list[tuple[dict[str, Any], str]] = [
        ({"tools": [{"type": "namespace", "name": "ns"}]}, "tools[0].tools: Field required"),
        ({"previous_response_id": "resp_123"}, "previous_response_id: Reef is stateless"),
        ({"background": True}, "background:"),
        ({"text": {"format": {"type": "json_object"}}}, "text:"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
            "input[0].content[0].type: 'input_image' parts are not supported",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type: 'item_reference'"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": []}, "input"),
    ]
    for extra, message in refused:
        with pytest.raises(openai.BadRequestError) as info:
            oai.responses.create(**{"model": "m", "input": "hi", **extra})
        assert info.value.status_code == 400
        assert info.value.body["message"].startswith(message), (extra, info.value.body)
        assert info.value.body["type"] == "invalid_request_error"
        assert "x-reef-agent-record-id" not in info.value.response.headers
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    broken = httpx.post(f"{reef.base_url}/responses", content=b"{not json", headers=headers)
    assert broken.status_code == 400 and set(broken.json()["error"]) == {"message", "type", "param", "code"}
    missing = httpx.post(f"{reef.base_url}/responses", json={"model": "m"}, headers=headers)
    assert missing.status_code == 400 and missing.json()["error"]["message"].startswith("input")
    assert client.status()["storage"]["records"] == before


def test_tools_reef_cannot_serve_are_left_out_with_a_warning_and_a_namespace_is_served(
    oai: openai.OpenAI, client: ReefClient, upstream: ScriptedUpstream
) -> None:
    namespace = {"type": "namespace", "name": "agents", "description": "Sub-agents", "tools": TOOLS}
    tools = [{"type": "web_search"}, namespace, {"type": "custom", "name": "apply_patch"}]
    upstream.script(tool_calls=[{"name": "get_weather", "arguments": {"city": "Oslo"}}])
    raw = oai.responses.with_raw_response.create(model="m", input="weather?", tools=tools)  # type: ignore[arg-type]
    call = raw.parse().output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.namespace == "agents"  # called back as a function of its namespace (the SDK has the field)
    assert raw.headers["x-reef-warning"].startswith("tools left out, Reef cannot serve them: web_search, custom")
    assert [t["function"]["name"] for t in upstream.requests[-1].body["tools"]] == ["get_weather"]
    record = client.record(raw.headers["x-reef-agent-record-id"])["record"]
    assert record["request"]["dropped_tools"] == ["web_search", "custom"]
    upstream.script(text="plain")
    plain = oai.responses.with_raw_response.create(model="m", input="hi", tools=TOOLS)  # type: ignore[arg-type]
    assert "x-reef-warning" not in plain.headers
    with pytest.raises(InvalidInput, match=r"tools\[0\]\.type: 'web_search' tools are not supported"):
        responses_wire.parse_responses_request({"model": "m", "input": "hi", "tools": tools}, "refuse")


def test_unsupported_tools_refuse_answers_400(upstream: ScriptedUpstream, tmp_path: Path) -> None:
    settings = {"unsupported_tools": "refuse", "upstream": {"url": upstream.base_url, "model": "provider-model"}}
    with ReefServer(tmp_path, settings) as server:
        refusing = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=20)
        with pytest.raises(openai.BadRequestError, match=r"tools\[1\]\.type: 'web_search' tools are not supported"):
            refusing.responses.create(model="m", input="hi", tools=[*TOOLS, {"type": "web_search"}])  # type: ignore[list-item]
    assert upstream.requests == []


def test_provider_failures_are_502s_with_receipts_and_in_stream_errors(
    oai: openai.OpenAI, client: ReefClient, upstream: ScriptedUpstream
) -> None:
    upstream.script(status=500, error="provider exploded")
    with pytest.raises(openai.InternalServerError) as failed:
        oai.responses.create(model="m", input="hi")
    assert failed.value.status_code == 502 and set(failed.value.body) == {"message", "type", "param", "code"}
    receipt = failed.value.response.headers["x-reef-agent-record-id"]
    record = client.record(receipt)["record"]
    assert record["status"] == "incomplete" and record["error"]
    client.report(receipt, score=0.0, feedback="the provider failed")  # a failure is reportable too

    upstream.script(mode="stop_midstream", text="half of an answer that stops")
    raw = oai.responses.with_raw_response.create(model="m", input="hi", stream=True)
    events = list(raw.parse())
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].message and events[-1].response.status == "failed" and events[-1].response.error.message
    assert [e.sequence_number for e in events] == list(range(len(events)))
    record = client.record(raw.headers["x-reef-agent-record-id"])["record"]
    assert record["status"] == "incomplete" and record["error"]


def test_every_sdk_field_is_decided_and_documented() -> None:
    known = set(typing.get_type_hints(response_create_params.ResponseCreateParamsBase)) | {"stream"}
    decided = responses_wire.SUPPORTED | responses_wire.IGNORED | set(responses_wire.REFUSED)
    assert known <= decided, sorted(known - decided)
    assert not (responses_wire.SUPPORTED & responses_wire.IGNORED) and not (decided - known)
    text = DOCS.read_text()
    section = text[text.index("## OpenAI Responses") :]
    for name in decided:
        assert f"| `{name}`" in section, f"{name} is missing from the Responses section of docs/wire.md"


def test_the_openapi_schema_declares_the_route(reef: ReefServer) -> None:
    schema = httpx.get(f"{reef.url}/openapi.json", headers={"authorization": f"Bearer {TOKEN}"}).json()
    body = schema["paths"]["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["model", "input"] and "tools" in body["properties"]


def test_input_items_become_one_conversation() -> None:
    """Parsing alone: roles, parts, dropped reasoning, and parallel calls joined into one
    assistant turn ahead of their outputs (what a chat-completions runtime needs)."""
    request = responses_wire.parse_responses_request(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Oslo"}, {"type": "input_text", "text": "and Bergen?"}],
                },
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
                },
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
                {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Bergen"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "rain"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "snow"}]},
            ],
            "tools": TOOLS,
            "tool_choice": "required",
            "max_output_tokens": 9,
            "stream": True,
            "include": ["reasoning.encrypted_content"],
            "reasoning": {"effort": "low"},
            "store": False,
            "text": {"format": {"type": "text"}, "verbosity": "low"},
            "previous_response_id": None,
            "newer_field": 1,
        }
    )
    assert request.dialect == "responses" and request.stream and request.max_tokens == 9
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("system", "Use tools."),
        ("user", "Oslo\nand Bergen?"),
        ("assistant", "Checking."),
        ("tool", "rain"),
        ("tool", "snow"),
    ]
    assert [c.id for c in request.messages[3].tool_calls] == ["c1", "c2"]
    assert [m.tool_call_id for m in request.messages[4:]] == ["c1", "c2"]
    assert request.tools[0].parameters == WEATHER and request.tool_choice == "required"
