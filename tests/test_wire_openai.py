"""The OpenAI Chat Completions wire: every field decided, and the official SDK parses what Reef sends.

Round trips go through the real `openai` client over an in-memory transport (no server, no
network): the client serializes a request, the handler parses it with Reef's parser and answers
with Reef's encoders, and the client's own stream parser and accumulator read the answer.
"""

from __future__ import annotations

import json
import typing
from typing import Any, Callable

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk, completion_create_params

from reef.core.chat import ChatRequest, Delta, Finish, Message, TextDelta, ToolCall, ToolCallDelta, Usage
from reef.serve import openai_wire
from reef.serve.openai_wire import ChunkEncoder, chat_completion, parse_chat_request
from tests.helpers.wire import (
    CALL,
    DELETE,
    DELTAS,
    DOCS,
    OSLO,
    RECEIPT,
    WEATHER,
    gathered,
    patched,
    raises_naming,
    sse_response,
)

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


def openai_client(handler: Callable[[httpx2.Request], httpx2.Response]) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="x",
        base_url="http://reef.test/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


def completion(deltas: list[Delta]) -> dict[str, Any]:
    return chat_completion(gathered(deltas), completion_id="chatcmpl-1", created=1, model="m")


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
