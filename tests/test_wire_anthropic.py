"""The Anthropic Messages wire: every field decided, and the official SDK parses what Reef sends.

Round trips go through the real `anthropic` client over an in-memory transport (no server, no
network): the client serializes a request, the handler parses it with Reef's parser and answers
with Reef's encoders, and the client's own stream parser and accumulator read the answer.
"""

from __future__ import annotations

import json
import typing
from typing import Any, Callable

import anthropic
import httpx2
import pytest
from anthropic.types import Message as AnthropicMessage
from anthropic.types import RawMessageStreamEvent, message_create_params
from anthropic.types.beta import message_create_params as beta_params
from pydantic import TypeAdapter

from reef.core.chat import ChatRequest, Delta, Finish, Message, TextDelta, ToolCall, ToolCallDelta, Usage
from reef.serve import anthropic_wire
from reef.serve.anthropic_wire import EventEncoder, message_response, parse_count_tokens_request, parse_messages_request
from tests.helpers.wire import (
    CALL,
    DELETE,
    DELTAS,
    DOCS,
    RECEIPT,
    WEATHER,
    gathered,
    patched,
    raises_naming,
    sse_response,
)

# -- Anthropic: parsing ----------------------------------------------------------------------

ANTHROPIC_AGENT = {
    "model": "claude-sonnet",
    "max_tokens": 256,
    "system": [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Use tools."},
    ],
    "messages": [
        {"role": "user", "content": "Weather in Oslo and Bergen?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "two calls", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Bergen"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": [{"type": "text", "text": "timeout"}, {"type": "text", "text": "retry later"}],
                },
                {"type": "text", "text": "Summarize."},
                {"type": "text", "text": "Briefly."},
            ],
        },
    ],
    "tools": [
        {
            "name": "weather",
            "description": "Weather now",
            "input_schema": WEATHER,
            "cache_control": {"type": "ephemeral"},
        }
    ],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    "stop_sequences": ["END"],
    "temperature": 0.5,
    "top_p": 0.9,
    "stream": True,
    "metadata": {"user_id": "u"},
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "top_k": None,
    "output_config": {"effort": "high"},
    "service_tier": "auto",
    "some_future_field": 1,
}


def test_anthropic_agent_conversation_parses() -> None:
    req = parse_messages_request(ANTHROPIC_AGENT)
    assert req.dialect == "anthropic" and req.model == "claude-sonnet" and req.max_tokens == 256 and req.stream
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert req.messages[0].content == "Be brief.\nUse tools."
    assert req.messages[2].content == "Checking."
    assert req.messages[2].tool_calls == (
        ToolCall("toolu_1", "weather", json.dumps({"city": "Oslo"})),
        ToolCall("toolu_2", "weather", json.dumps({"city": "Bergen"})),
    )
    assert req.messages[3] == Message(role="tool", content="rain", tool_call_id="toolu_1")
    assert req.messages[4] == Message(role="tool", content="timeout\nretry later", tool_call_id="toolu_2")
    assert req.messages[5] == Message(role="user", content="Summarize.\nBriefly.")
    assert req.tools[0].parameters == WEATHER and req.tools[0].description == "Weather now"
    assert (req.tool_choice, req.stop, req.temperature, req.top_p) == ("required", ("END",), 0.5, 0.9)


@pytest.mark.parametrize(
    "choice, expected",
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "weather"}, {"name": "weather"}),
    ],
)
def test_anthropic_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    body = {
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "x"}],
        "tool_choice": choice,
        "tools": [{"name": "weather", "input_schema": WEATHER}],
    }
    assert parse_messages_request(body).tool_choice == expected


def test_anthropic_minimal_count_tokens_and_system_messages() -> None:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    raises_naming("max_tokens", parse_messages_request, body)
    req = parse_count_tokens_request(body)
    assert req.messages == (Message(role="user", content="hi"),) and req.max_tokens is None and not req.stream
    with_system = {**body, "system": "sys", "messages": [{"role": "system", "content": "more"}, *body["messages"]]}
    assert [m.role for m in parse_count_tokens_request(with_system).messages] == ["system", "system", "user"]
    assert parse_count_tokens_request({**body, "system": ""}).messages[0].role == "user"
    tool_only = {
        "model": "m",
        "max_tokens": 3,
        "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
    }
    assert parse_messages_request(tool_only).messages == (Message(role="tool", content="", tool_call_id="t"),)


@pytest.mark.parametrize(
    "field, value",
    [
        ("top_k", 5),
        ("output_config", {"format": {"type": "json_schema", "schema": {}}}),
        ("output_format", {"type": "json_schema", "schema": {}}),
        ("container", "cntr_1"),
        ("mcp_servers", [{"type": "url", "url": "http://x", "name": "x"}]),
        ("compaction", {"type": "auto"}),
        ("thread", {"type": "create"}),
    ],
)
def test_anthropic_refused_fields_name_themselves(field: str, value: Any) -> None:
    body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], field: value}
    raises_naming(field, parse_messages_request, body)


ANTHROPIC_BASE = {
    "model": "m",
    "max_tokens": 8,
    "system": "s",
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
    ],
    "tools": [{"name": "f", "input_schema": {"type": "object"}}],
}


@pytest.mark.parametrize(
    "path, value, named",
    [
        ("model", DELETE, "model"),
        ("model", 1, "model"),
        ("max_tokens", 0, "max_tokens"),
        ("max_tokens", "10", "max_tokens"),
        ("max_tokens", 1.5, "max_tokens"),
        ("messages", [], "messages"),
        ("messages", DELETE, "messages"),
        ("messages.0", 3, "messages[0]"),
        ("messages.0.role", "tool", "messages[0].role"),
        ("messages.0.content", 5, "messages[0].content"),
        ("messages.0.content", DELETE, "messages[0].content"),
        ("messages.0.content.0", {"type": "image", "source": {}}, "messages[0].content[0].type"),
        ("messages.0.content.0", {"type": "document", "source": {}}, "messages[0].content[0].type"),
        ("messages.0.content.0", {"text": "no type"}, "messages[0].content[0].type"),
        ("messages.0.content.0.text", DELETE, "messages[0].content[0].text"),
        (
            "messages.0.content.0",
            {"type": "tool_use", "id": "x", "name": "f", "input": {}},
            "messages[0].content[0].type",
        ),
        ("messages.1.content.0.input", "{}", "messages[1].content[0].input"),
        ("messages.1.content.0.id", DELETE, "messages[1].content[0].id"),
        ("messages.1.content.0", {"type": "tool_result", "tool_use_id": "t1"}, "messages[1].content[0].type"),
        (
            "messages.1.content.0",
            {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
            "messages[1].content[0].type",
        ),
        ("messages.2.content.0.tool_use_id", DELETE, "messages[2].content[0].tool_use_id"),
        ("messages.2.content.0.content", [{"type": "image", "source": {}}], "messages[2].content[0].content[0].type"),
        ("messages.2.content.0.content", 7, "messages[2].content[0].content"),
        ("messages.2.content.0.is_error", "yes", "messages[2].content[0].is_error"),
        ("system", 5, "system"),
        ("system", [{"type": "image"}], "system[0].type"),
        ("temperature", 1.5, "temperature"),
        ("temperature", "warm", "temperature"),
        ("top_p", 0, "top_p"),
        ("stop_sequences", "END", "stop_sequences"),
        ("stop_sequences", [""], "stop_sequences[0]"),
        ("stream", 1, "stream"),
        ("tools.0.input_schema", DELETE, "tools[0].input_schema"),
        ("tools.0.name", "", "tools[0].name"),
        ("tools.0", {"type": "web_search_20250305", "name": "web_search"}, "tools[0].type"),
        ("tools.0", {"type": "bash_20250124", "name": "bash"}, "tools[0].type"),
        ("tool_choice", {"type": "bogus"}, "tool_choice.type"),
        ("tool_choice", "auto", "tool_choice"),
        ("tool_choice", {"type": "tool"}, "tool_choice.name"),
        ("tool_choice", {"type": "tool", "name": "g"}, "tool_choice.name"),
    ],
)
def test_anthropic_malformed_bodies_name_the_field(path: str, value: Any, named: str) -> None:
    raises_naming(named, parse_messages_request, patched(ANTHROPIC_BASE, path, value))


def test_anthropic_other_malformed_bodies() -> None:
    raises_naming("body", parse_messages_request, "hello")
    no_tools = {
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "x"}],
        "tool_choice": {"type": "any"},
    }
    raises_naming("tool_choice.type", parse_messages_request, no_tools)


def test_anthropic_every_sdk_field_is_decided_and_documented() -> None:
    known = (
        set(typing.get_type_hints(message_create_params.MessageCreateParamsBase))
        | set(typing.get_type_hints(beta_params.MessageCreateParamsBase))
        | {"stream"}
    )
    decided = anthropic_wire.SUPPORTED | anthropic_wire.IGNORED | set(anthropic_wire.REFUSED)
    assert known <= decided, sorted(known - decided)
    assert not (anthropic_wire.SUPPORTED & anthropic_wire.IGNORED)
    documented = DOCS.read_text()
    for name in decided:
        assert f"| `{name}`" in documented, f"{name} is missing from docs/wire.md"


# -- Anthropic: responses through the real SDK -----------------------------------------------


def test_anthropic_message_body_validates() -> None:
    body = message_response(gathered(DELTAS), message_id="msg_1", model="m")
    parsed = AnthropicMessage.model_validate(body)
    assert parsed.stop_reason == "tool_use" and parsed.stop_sequence is None
    assert [b.type for b in parsed.content] == ["text", "tool_use", "tool_use"]
    inputs = [b.input for b in parsed.content if b.type == "tool_use"]
    assert inputs == [{"city": "Oslo"}, {"raw": "not json"}]
    assert (parsed.usage.input_tokens, parsed.usage.output_tokens) == (11, 5)
    for reason, expected in [("stop", "end_turn"), ("length", "max_tokens")]:
        body = message_response(gathered([Finish(reason)]), message_id="msg_1", model="m")  # type: ignore[arg-type]
        assert AnthropicMessage.model_validate(body).stop_reason == expected and body["content"] == []
    with pytest.raises(ValueError):
        message_response(gathered([Finish("error")]), message_id="msg_1", model="m")
    assert [anthropic_wire.tool_input(a) for a in ["", "  ", "[1]", '{"a": 1}', "{"]] == [
        {},
        {},
        {"raw": "[1]"},
        {"a": 1},
        {"raw": "{"},
    ]


def anthropic_stream_bytes(deltas: list[Delta]) -> bytes:
    encoder = EventEncoder("msg_1", "served", input_tokens=11)
    frames = encoder.start() + [f for d in deltas for f in encoder.encode(d)] + [encoder.stop(RECEIPT)]
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    for frame in frames:
        kind, data = frame.decode().split("\n")[:2]
        payload = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {payload['type']}" and frame.endswith(b"\n\n")
        if payload["type"] not in ("ping", "error"):
            adapter.validate_python(payload)  # strict: the SDK itself only constructs
    return b"".join(frames)


def anthropic_client(handler: Callable[[httpx2.Request], httpx2.Response]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="x",
        base_url="http://reef.test",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


STREAMED: list[Delta] = [
    TextDelta("Hel"),
    TextDelta("lo"),
    ToolCallDelta(CALL, 0),
    TextDelta("More"),
    ToolCallDelta(ToolCall("call_10", "weather", "not json"), 1),
    ToolCallDelta(ToolCall("c11", "now", ""), 2),
    Finish("tool_calls", Usage(11, 5)),
]


def test_anthropic_stream_round_trip_through_the_sdk() -> None:
    seen: list[ChatRequest] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(parse_messages_request(json.loads(request.content)))
        return sse_response(anthropic_stream_bytes(STREAMED))

    client = anthropic_client(handler)
    kwargs: dict[str, Any] = dict(
        model="claude-x",
        max_tokens=100,
        system="be brief",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[{"name": "weather", "input_schema": WEATHER}],
        extra_body={"temperature": 0.3},
    )
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert seen[0].stream and seen[0].temperature == 0.3
    assert seen[0].messages[0] == Message(role="system", content="be brief")
    assert [b.type for b in final.content] == ["text", "tool_use", "text", "tool_use", "tool_use"]
    assert final.content[0].text == "Hello" and final.content[2].text == "More"  # type: ignore[union-attr]
    assert [(b.id, b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        ("call_9", "weather", {"city": "Oslo"}),
        ("call_10", "weather", {"raw": "not json"}),
        ("c11", "now", {}),
    ]
    assert final.stop_reason == "tool_use" and (final.usage.input_tokens, final.usage.output_tokens) == (11, 5)
    events = list(client.messages.create(stream=True, **kwargs))
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    assert (events[-1].model_extra or {})["reef"] == RECEIPT


def test_anthropic_stream_of_plain_text_and_of_nothing() -> None:
    cases: list[tuple[list[Delta], list[str]]] = [
        ([TextDelta("a"), TextDelta("b"), Finish("length", Usage(1, 2))], ["ab"]),
        ([Finish("stop")], []),
    ]
    for deltas, text in cases:
        body = anthropic_stream_bytes(deltas)
        client = anthropic_client(lambda request: sse_response(body))
        with client.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as stream:
            final = stream.get_final_message()
        assert [b.text for b in final.content if b.type == "text"] == text
        assert final.stop_reason == ("max_tokens" if text else "end_turn")


def test_anthropic_stream_error_is_raised_by_the_sdk() -> None:
    body = anthropic_stream_bytes([TextDelta("partial"), Finish("error")])
    client = anthropic_client(lambda request: sse_response(body))
    with pytest.raises(anthropic.APIError, match="runtime failed"):
        list(client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}], stream=True))


def test_anthropic_error_and_count_bodies() -> None:
    assert anthropic_wire.error_body("invalid_request_error", "max_tokens: Field required") == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
    assert anthropic_wire.count_tokens_response(12) == {"input_tokens": 12}
    assert anthropic_wire.event("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'
