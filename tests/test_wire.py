"""The wire dialects: every field decided, and the official SDKs parse what Reef sends.

Round trips go through the real `openai` and `anthropic` clients over an in-memory transport
(no server, no network): the client serializes a request, the handler parses it with Reef's
parser and answers with Reef's encoders, and the client's own stream parser and accumulator
read the answer.
"""

from __future__ import annotations

import copy
import json
import typing
from pathlib import Path
from typing import Any, Callable

import anthropic
import httpx2
import openai
import pytest
from anthropic.types import Message as AnthropicMessage
from anthropic.types import RawMessageStreamEvent, message_create_params
from anthropic.types.beta import message_create_params as beta_params
from openai.types.chat import ChatCompletion, ChatCompletionChunk, completion_create_params
from pydantic import TypeAdapter

from reef.core.chat import ChatRequest, ChatResult, Delta, Finish, Message, TextDelta, ToolCall, ToolCallDelta, Usage
from reef.core.errors import InvalidInput
from reef.serve import anthropic_wire, openai_wire
from reef.serve.anthropic_wire import EventEncoder, message_response, parse_count_tokens_request, parse_messages_request
from reef.serve.openai_wire import ChunkEncoder, chat_completion, parse_chat_request

DOCS = Path(__file__).resolve().parent.parent / "docs" / "wire.md"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def raises_naming(path: str, parse: Callable[[Any], ChatRequest], body: Any) -> str:
    with pytest.raises(InvalidInput) as info:
        parse(body)
    message = str(info.value)
    assert message.startswith(f"{path}:") or message.startswith(f"{path} "), message
    return message


def patched(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `base` with the dotted `path` (ints index lists) set, or removed for DELETE."""
    body = copy.deepcopy(base)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    target: Any = body
    for p in parents:
        target = target[p]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return body


DELETE = object()
OSLO = json.dumps({"city": "Oslo"})


def sse_response(body: bytes) -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)


# -- OpenAI: parsing ------------------------------------------------------------------------

OPENAI_AGENT = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
        {
            "role": "user",
            "name": "ann",
            "content": [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Oslo?"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": OSLO}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
        {"role": "assistant", "content": [{"type": "text", "text": "It rains."}]},
        {"role": "user", "content": "thanks"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {"name": "weather", "description": "Weather now", "parameters": WEATHER, "strict": True},
        }
    ],
    "tool_choice": {"type": "function", "function": {"name": "weather"}},
    "temperature": 0.2,
    "top_p": 0.9,
    "max_completion_tokens": 64,
    "stop": "END",
    "seed": 7,
    "stream": True,
    "stream_options": {"include_usage": True},
    "user": "u1",
    "metadata": {"k": "v"},
    "store": False,
    "parallel_tool_calls": False,
    "service_tier": "auto",
    "frequency_penalty": 0,
    "presence_penalty": 0.0,
    "n": 1,
    "logprobs": False,
    "logit_bias": {},
    "response_format": {"type": "text"},
    "modalities": ["text"],
    "reasoning_effort": "low",
    "some_future_field": 1,
}


def test_openai_agent_conversation_parses() -> None:
    req = parse_chat_request(OPENAI_AGENT)
    assert req.dialect == "openai" and req.model == "gpt-4o" and req.stream
    assert [m.role for m in req.messages] == ["system", "system", "user", "assistant", "tool", "assistant", "user"]
    assert req.messages[1].content == "Use tools."
    assert req.messages[2] == Message(role="user", content="Weather in\nOslo?", name="ann")
    assert req.messages[3].content == "" and req.messages[3].tool_calls == (ToolCall("call_1", "weather", OSLO),)
    assert req.messages[4] == Message(role="tool", content="rain", tool_call_id="call_1")
    assert (req.tools[0].name, req.tools[0].parameters, req.tools[0].description) == ("weather", WEATHER, "Weather now")
    assert req.tool_choice == {"name": "weather"}
    assert (req.temperature, req.top_p, req.max_tokens, req.stop, req.seed) == (0.2, 0.9, 64, ("END",), 7)
    assert openai_wire.stream_include_usage(OPENAI_AGENT)
    assert not openai_wire.stream_include_usage({**OPENAI_AGENT, "stream": False})


def test_openai_minimal_and_token_limits() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    req = parse_chat_request(body)
    assert req.messages == (Message(role="user", content="hi"),) and req.max_tokens is None and not req.stream
    assert req.tools == () and req.tool_choice is None and req.stop == ()
    assert parse_chat_request({**body, "max_tokens": 5}).max_tokens == 5
    assert parse_chat_request({**body, "max_tokens": 5, "max_completion_tokens": 5}).max_tokens == 5
    assert parse_chat_request({**body, "stop": ["a", "b"]}).stop == ("a", "b")
    bare_tool = {"type": "function", "function": {"name": "f"}}
    assert parse_chat_request({**body, "tools": [bare_tool]}).tools[0].parameters == {
        "type": "object",
        "properties": {},
    }
    raises_naming("max_tokens", parse_chat_request, {**body, "max_tokens": 5, "max_completion_tokens": 6})


@pytest.mark.parametrize(
    "field, value",
    [
        ("n", 2),
        ("logit_bias", {"50256": -100}),
        ("logprobs", True),
        ("top_logprobs", 3),
        ("response_format", {"type": "json_object"}),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
        ("functions", [{"name": "f"}]),
        ("function_call", "auto"),
        ("frequency_penalty", 0.5),
        ("presence_penalty", -1),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("web_search_options", {}),
        ("moderation", {"model": "m"}),
    ],
)
def test_openai_refused_fields_name_themselves(field: str, value: Any) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: value}
    raises_naming(field, parse_chat_request, body)


OPENAI_BASE = {
    "model": "m",
    "messages": [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
}


@pytest.mark.parametrize(
    "path, value, named",
    [
        ("model", DELETE, "model"),
        ("model", 5, "model"),
        ("model", "", "model"),
        ("messages", DELETE, "messages"),
        ("messages", [], "messages"),
        ("messages", "hi", "messages"),
        ("messages.0", "hi", "messages[0]"),
        ("messages.0.role", "robot", "messages[0].role"),
        ("messages.0.role", "function", "messages[0].role"),
        ("messages.0.role", DELETE, "messages[0].role"),
        ("messages.0.content", 5, "messages[0].content"),
        ("messages.0.content", DELETE, "messages[0].content"),
        (
            "messages.0.content",
            [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}],
            "messages[0].content[1].type",
        ),
        ("messages.0.content", [{"type": "input_audio", "input_audio": {}}], "messages[0].content[0].type"),
        ("messages.0.content", [{"type": "text"}], "messages[0].content[0].text"),
        ("messages.0.name", 3, "messages[0].name"),
        ("messages.1.tool_calls.0.function", DELETE, "messages[1].tool_calls[0].function"),
        ("messages.1.tool_calls.0.function.arguments", {"a": 1}, "messages[1].tool_calls[0].function.arguments"),
        ("messages.1.tool_calls.0.type", "custom", "messages[1].tool_calls[0].type"),
        ("messages.1.tool_calls.0.id", DELETE, "messages[1].tool_calls[0].id"),
        ("messages.1.function_call", {"name": "f", "arguments": "{}"}, "messages[1].function_call"),
        ("messages.1.tool_calls", DELETE, "messages[1].content"),
        ("messages.2.tool_call_id", DELETE, "messages[2].tool_call_id"),
        ("temperature", 2.5, "temperature"),
        ("temperature", "hot", "temperature"),
        ("top_p", 0, "top_p"),
        ("top_p", 1.5, "top_p"),
        ("max_tokens", 0, "max_tokens"),
        ("max_tokens", "5", "max_tokens"),
        ("max_completion_tokens", -1, "max_completion_tokens"),
        ("stop", 5, "stop"),
        ("stop", ["a", 5], "stop[1]"),
        ("stop", ["a", "b", "c", "d", "e"], "stop"),
        ("stop", [""], "stop[0]"),
        ("stream", "yes", "stream"),
        ("stream_options", {"include_usage": "x"}, "stream_options.include_usage"),
        ("seed", 1.5, "seed"),
        ("n", "1", "n"),
        ("tools", {"f": 1}, "tools"),
        ("tools.0.function.name", DELETE, "tools[0].function.name"),
        ("tools.0.function.parameters", "x", "tools[0].function.parameters"),
        ("tool_choice", "sometimes", "tool_choice"),
        ("tool_choice", {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, "tool_choice.type"),
        ("tool_choice", {"type": "function", "function": {"name": "g"}}, "tool_choice.function.name"),
        ("tool_choice", {"type": "function"}, "tool_choice.function.name"),
    ],
)
def test_openai_malformed_bodies_name_the_field(path: str, value: Any, named: str) -> None:
    raises_naming(named, parse_chat_request, patched(OPENAI_BASE, path, value))


def test_openai_other_malformed_bodies() -> None:
    raises_naming("body", parse_chat_request, ["not", "an", "object"])
    raises_naming(
        "tool_choice",
        parse_chat_request,
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
    )


def test_openai_tools_other_than_functions_are_left_out_or_refused() -> None:
    body = {**OPENAI_BASE, "tools": [{"type": "custom", "custom": {"name": "patch"}}, *OPENAI_BASE["tools"]]}
    request = parse_chat_request(body)
    assert [t.name for t in request.tools] == ["f"] and request.to_json()["dropped_tools"] == ["custom"]
    assert "dropped_tools" not in parse_chat_request(OPENAI_BASE).to_json()  # a record without any keeps its hash
    raises_naming("tools[0].type", lambda b: parse_chat_request(b, "refuse"), body)


def test_openai_every_sdk_field_is_decided_and_documented() -> None:
    known = set(typing.get_type_hints(completion_create_params.CompletionCreateParamsBase)) | {"stream"}
    decided = openai_wire.SUPPORTED | openai_wire.IGNORED | set(openai_wire.REFUSED)
    assert known <= decided, sorted(known - decided)
    assert not (openai_wire.SUPPORTED & openai_wire.IGNORED) and not (decided - known)
    documented = DOCS.read_text()
    for name in decided:
        assert f"| `{name}`" in documented, f"{name} is missing from docs/wire.md"


# -- OpenAI: responses through the real SDK --------------------------------------------------

RECEIPT = {"agent_record_id": "rec_1", "release_id": "rel_1", "verified": True}


def openai_client(handler: Callable[[httpx2.Request], httpx2.Response]) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="x",
        base_url="http://reef.test/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


def gathered(deltas: list[Delta]) -> ChatResult:
    result = ChatResult()
    for delta in deltas:
        result.add(delta)
    return result


def completion(deltas: list[Delta]) -> dict[str, Any]:
    return chat_completion(gathered(deltas), completion_id="chatcmpl-1", created=1, model="m")


CALL = ToolCall("call_9", "weather", OSLO)
DELTAS: list[Delta] = [
    TextDelta("Hel"),
    TextDelta(""),
    TextDelta("lo"),
    ToolCallDelta(CALL, 0),
    ToolCallDelta(ToolCall("call_10", "weather", "not json"), 1),
    Finish("tool_calls", Usage(11, 5)),
]


def test_openai_completion_body_validates() -> None:
    parsed = ChatCompletion.model_validate(completion([TextDelta("Hi"), Finish("stop", Usage(3, 1))]))
    assert parsed.choices[0].message.content == "Hi" and parsed.choices[0].finish_reason == "stop"
    assert parsed.usage is not None and parsed.usage.total_tokens == 4
    parsed = ChatCompletion.model_validate(completion(DELTAS))
    message = parsed.choices[0].message
    assert message.content == "Hello" and parsed.choices[0].finish_reason == "tool_calls"
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ("call_9", "weather", OSLO),
        ("call_10", "weather", "not json"),
    ]
    only_call = ChatCompletion.model_validate(completion([ToolCallDelta(CALL), Finish("tool_calls")]))
    assert only_call.choices[0].message.content is None
    assert ChatCompletion.model_validate(completion([Finish("length")])).choices[0].finish_reason == "length"
    with pytest.raises(ValueError):
        completion([Finish("error")])


def openai_stream_bytes(deltas: list[Delta], include_usage: bool) -> bytes:
    encoder = ChunkEncoder("chatcmpl-1", 1700000000, "served", include_usage)
    chunks = [encoder.first()] + [c for d in deltas for c in encoder.encode(d)]
    chunks.append(encoder.reef_chunk(**RECEIPT))
    for chunk in chunks:
        if "error" not in chunk:
            ChatCompletionChunk.model_validate(chunk)  # strict: the SDK itself only constructs
    return b"".join(openai_wire.sse(c) for c in chunks) + openai_wire.DONE


@pytest.mark.parametrize("include_usage", [True, False])
def test_openai_stream_round_trip_through_the_sdk(include_usage: bool) -> None:
    seen: list[ChatRequest] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        chat = parse_chat_request(json.loads(request.content))
        seen.append(chat)
        return sse_response(openai_stream_bytes(DELTAS, openai_wire.stream_include_usage(json.loads(request.content))))

    client = openai_client(handler)
    kwargs: dict[str, Any] = dict(
        model="gpt-4o",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}],
        stream_options={"include_usage": include_usage},
    )
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert seen[0].stream and seen[0].tools[0].name == "weather"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    last = chunks[-1]
    assert last.choices == [] and (last.model_extra or {})["reef"] == RECEIPT
    with client.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.message.content == "Hello" and choice.finish_reason == "tool_calls"
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []] == [
        ("call_9", "weather", OSLO),
        ("call_10", "weather", "not json"),
    ]
    if include_usage:
        assert final.usage is not None and (final.usage.prompt_tokens, final.usage.completion_tokens) == (11, 5)
    else:
        assert final.usage is None


def test_openai_stream_error_is_raised_by_the_sdk() -> None:
    body = openai_stream_bytes([TextDelta("partial"), Finish("error")], include_usage=False)
    client = openai_client(lambda request: sse_response(body))
    with pytest.raises(openai.APIError, match="runtime failed"):
        list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True))


def test_openai_module_reef_chunk_and_error_body() -> None:
    chunk = openai_wire.reef_chunk("rec", "rel", False, completion_id="c", created=2, model="m")
    assert ChatCompletionChunk.model_validate(chunk).choices == [] and chunk["reef"]["verified"] is False
    assert openai_wire.sse({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
    error = openai_wire.error_body("messages: Field required", "invalid_request_error")
    assert error == {
        "error": {"message": "messages: Field required", "type": "invalid_request_error", "param": None, "code": None}
    }


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
