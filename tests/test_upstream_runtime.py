"""UpstreamRuntime against a real scripted HTTP upstream, in both upstream dialects."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any, Iterator

import pytest

from reef.core.chat import ChatRequest, ChatResult, Delta, Message, TextDelta, Tool, ToolCall, ToolCallDelta
from reef.core.errors import RuntimeFailure
from reef.core.types import ReleaseRef
from reef.runtimes.upstream import UpstreamRuntime
from reef.runtimes.upstream_wire import sse_events
from tests.scripted_upstream import ScriptedUpstream

KEY = "sk-test-SECRET-4f9a1c"
DIALECTS = ["openai", "anthropic"]
WEATHER = Tool("get_weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}}})


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as upstream:
        yield upstream


@pytest.fixture
def upstream(server: ScriptedUpstream) -> ScriptedUpstream:
    server.clear()
    return server


def runtime(up: ScriptedUpstream, dialect: str, **kw: Any) -> UpstreamRuntime:
    url = up.base_url if dialect == "openai" else up.root_url
    kw.setdefault("model", "served-model")
    return UpstreamRuntime(url, api_key=KEY, dialect=dialect, **kw)  # type: ignore[arg-type]


def ask(text: str = "hello", *, stream: bool = False, dialect: str = "openai", **kw: Any) -> ChatRequest:
    return ChatRequest(
        model="client-model",
        messages=(Message("user", text),),
        dialect=dialect,  # type: ignore[arg-type]
        stream=stream,
        **kw,
    )


async def _collect(rt: UpstreamRuntime, request: ChatRequest, load: str | None, into: list[Delta]) -> list[Delta]:
    await rt.start()
    try:
        async for delta in rt.generate(request, ReleaseRef("rel-1", "content-1", load)):
            into.append(delta)
        return into
    finally:
        await rt.close()


def collect(rt: UpstreamRuntime, request: ChatRequest, load: str | None = None) -> list[Delta]:
    return asyncio.run(_collect(rt, request, load, []))


def result(deltas: list[Delta]) -> ChatResult:
    gathered = ChatResult()
    for d in deltas:
        gathered.add(d)
    return gathered


def failure(rt: UpstreamRuntime, request: ChatRequest) -> tuple[RuntimeFailure, list[Delta]]:
    seen: list[Delta] = []
    with pytest.raises(RuntimeFailure) as info:
        asyncio.run(_collect(rt, request, None, seen))
    assert KEY not in str(info.value)
    return info.value, seen


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stream_events_of_separate_reads_stay_separate(upstream: ScriptedUpstream, dialect: str) -> None:
    upstream.script(text="The quick brown fox jumps.", mode="slow", delay=0.02)
    texts = [d for d in collect(runtime(upstream, dialect), ask(stream=True)) if isinstance(d, TextDelta)]
    assert [t.text for t in texts] == ["The", " quick", " brown", " fox", " jumps."]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_text_usage_model_and_finish(upstream: ScriptedUpstream, dialect: str, stream: bool) -> None:
    upstream.script(text="The quick brown fox jumps.", usage=(11, 5), model="upstream-model-v2")
    deltas = collect(runtime(upstream, dialect), ask(stream=stream))
    texts = [d for d in deltas if isinstance(d, TextDelta)]
    assert len(texts) == 1  # the scripted upstream sends its events in one write: one delta per read
    assert all(d.token_ids == () and d.runtime_load_id is None for d in texts)
    got = result(deltas)
    assert (got.text, got.finish_reason, got.model) == ("The quick brown fox jumps.", "stop", "upstream-model-v2")
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (11, 5)
    assert upstream.requests[-1].body["stream"] is stream


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_calls_arrive_whole(upstream: ScriptedUpstream, dialect: str, stream: bool) -> None:
    calls = [
        {"id": "call_a", "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
        {"id": "call_b", "name": "lookup", "arguments": {"q": "long query text " * 3}},
    ]
    upstream.script(text="Checking.", tool_calls=calls)
    deltas = collect(runtime(upstream, dialect), ask(stream=stream, tools=(WEATHER,)))
    tool_deltas = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert [d.index for d in tool_deltas] == [0, 1]
    assert [(d.call.id, d.call.name, json.loads(d.call.arguments)) for d in tool_deltas] == [
        (c["id"], c["name"], c["arguments"]) for c in calls
    ]
    got = result(deltas)
    assert (got.text, got.finish_reason) == ("Checking.", "tool_calls")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_length_finish_maps(upstream: ScriptedUpstream, dialect: str, stream: bool) -> None:
    upstream.script(text="cut off", finish="length")
    assert result(collect(runtime(upstream, dialect), ask(stream=stream))).finish_reason == "length"


def conversation(dialect: str, stream: bool) -> ChatRequest:
    return ChatRequest(
        model="claude-x",
        dialect=dialect,
        stream=stream,
        tools=(WEATHER,),
        tool_choice="required",  # type: ignore[arg-type]
        max_tokens=None if dialect == "openai" else 300,
        temperature=0.2,
        top_p=0.9,
        stop=("END",),
        messages=(
            Message("system", "Be brief."),
            Message("user", "Weather in Paris and Rome?"),
            Message(
                "assistant",
                "Let me look.",
                tool_calls=(
                    ToolCall("toolu_1", "get_weather", '{"city": "Paris"}'),
                    ToolCall("toolu_2", "get_weather", '{"city": "Rome"}'),
                ),
            ),
            Message("tool", "18C", tool_call_id="toolu_1"),
            Message("tool", "22C", tool_call_id="toolu_2"),
            Message("user", "Thanks; and tomorrow?"),
        ),
    )


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_client_request_goes_out_as_openai(upstream: ScriptedUpstream, stream: bool) -> None:
    collect(runtime(upstream, "openai"), conversation("anthropic", stream))
    sent = upstream.requests[-1]
    assert sent.path == "/v1/chat/completions"
    body = sent.body
    assert body["model"] == "served-model" and body["stream"] is stream
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "tool", "user"]
    assistant = body["messages"][2]
    assert assistant["content"] == "Let me look."
    assert assistant["tool_calls"] == [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
    ]
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather for a city", "parameters": WEATHER.parameters},
        }
    ]
    assert body["tool_choice"] == "required"
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["stop"]) == (300, 0.2, 0.9, ["END"])
    assert ("stream_options" in body) is stream and body.get("stream_options", {"include_usage": True})["include_usage"]
    for message in body["messages"]:
        assert isinstance(message["content"], str) and set(message) <= {
            "role",
            "content",
            "tool_calls",
            "tool_call_id",
            "name",
        }


@pytest.mark.parametrize("stream", [False, True])
def test_openai_client_request_goes_out_as_anthropic(upstream: ScriptedUpstream, stream: bool) -> None:
    collect(runtime(upstream, "anthropic"), conversation("openai", stream))
    sent = upstream.requests[-1]
    assert sent.path == "/v1/messages"
    body = sent.body
    assert body["model"] == "served-model" and body["stream"] is stream
    assert body["system"] == "Be brief." and body["max_tokens"] == 1024
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][0]["content"] == "Weather in Paris and Rome?"
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
    ]
    assert body["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "22C"},
        {"type": "text", "text": "Thanks; and tomorrow?"},
    ]
    assert body["tools"] == [
        {"name": "get_weather", "description": "Weather for a city", "input_schema": WEATHER.parameters}
    ]
    assert body["tool_choice"] == {"type": "any"}
    assert (body["temperature"], body["top_p"], body["stop_sequences"]) == (0.2, 0.9, ["END"])
    assert not {"stop", "stream_options", "seed", "tool_calls"} & set(body)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_model_configured_or_passed_through(upstream: ScriptedUpstream, dialect: str) -> None:
    collect(runtime(upstream, dialect), ask())
    collect(runtime(upstream, dialect, pass_model_through=True), ask())
    collect(runtime(upstream, dialect, model=None), ask())
    assert [r.body["model"] for r in upstream.requests] == ["served-model", "client-model", "client-model"]
    assert runtime(upstream, dialect).served_models() == ["served-model"]
    assert runtime(upstream, dialect, model=None).served_models() == []


def test_api_key_travels_as_the_dialects_header(upstream: ScriptedUpstream) -> None:
    collect(runtime(upstream, "openai"), ask())
    collect(runtime(upstream, "anthropic"), ask())
    openai_headers, anthropic_headers = (r.headers for r in upstream.requests)
    assert openai_headers["authorization"] == f"Bearer {KEY}" and "x-api-key" not in openai_headers
    assert anthropic_headers["x-api-key"] == KEY and "authorization" not in anthropic_headers
    assert anthropic_headers["anthropic-version"] == "2023-06-01"


@pytest.mark.parametrize("stream", [False, True])
def test_default_echo_and_keep_alive(upstream: ScriptedUpstream, stream: bool) -> None:
    async def twice() -> list[str]:
        rt = runtime(upstream, "openai")
        await rt.start()
        try:
            return [
                result([d async for d in rt.generate(ask(f"ping {i}", stream=stream), ReleaseRef("r", "c"))]).text
                for i in range(2)
            ]
        finally:
            await rt.close()

    assert asyncio.run(twice()) == ["echo: ping 0", "echo: ping 1"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_upstream_400_is_relayed(upstream: ScriptedUpstream, dialect: str, stream: bool) -> None:
    upstream.script(status=400, error="max_tokens: must be at most 4096")
    exc, seen = failure(runtime(upstream, dialect), ask(stream=stream))
    assert exc.status == 400 and exc.error_type == "invalid_request_error" and not seen
    assert "max_tokens: must be at most 4096" in str(exc)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_upstream_500_is_502(upstream: ScriptedUpstream, dialect: str) -> None:
    upstream.script(status=500, error="the model crashed")
    exc, _ = failure(runtime(upstream, dialect), ask(stream=True))
    assert exc.status == 502 and "the model crashed" in str(exc)


def test_api_key_is_scrubbed_from_errors(upstream: ScriptedUpstream) -> None:
    upstream.script(status=401, error=f"Incorrect API key provided: {KEY}", error_type="authentication_error")
    exc, _ = failure(runtime(upstream, "openai"), ask())
    assert exc.status == 401 and exc.error_type == "authentication_error" and "[redacted]" in str(exc)


@pytest.mark.parametrize("stream", [False, True])
def test_hang_times_out(upstream: ScriptedUpstream, stream: bool) -> None:
    upstream.script(mode="hang")
    began = time.monotonic()
    exc, _ = failure(runtime(upstream, "anthropic", timeout=0.5), ask(stream=stream))
    assert time.monotonic() - began < 3 and exc.status == 502 and "timed out" in str(exc)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_reset_malformed_and_cut_streams_fail(upstream: ScriptedUpstream, dialect: str, stream: bool) -> None:
    for mode in ("reset", "malformed", "stop_midstream"):
        upstream.script(text="one two three four five six", mode=mode)
        exc, seen = failure(runtime(upstream, dialect), ask(stream=stream))
        assert exc.status == 502, mode
        if mode == "stop_midstream" and stream:
            assert "ended before" in str(exc)
            assert [d for d in seen if isinstance(d, TextDelta)], "text came before the failure"
        if mode == "malformed":
            assert "malformed JSON" in str(exc)


def test_connection_refused_is_502() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exc, _ = failure(UpstreamRuntime(f"http://127.0.0.1:{port}/v1", api_key=KEY, model="m"), ask())
    assert exc.status == 502 and "could not connect" in str(exc)


def test_slow_stream_is_delivered_incrementally(upstream: ScriptedUpstream) -> None:
    upstream.script(text="a b c d e f", mode="slow", delay=0.05)

    async def timed() -> tuple[float, float]:
        rt = runtime(upstream, "openai")
        began, first = time.monotonic(), 0.0
        async for delta in rt.generate(ask(stream=True), ReleaseRef("r", "c")):
            first = first or time.monotonic() - began
        await rt.close()
        return first, time.monotonic() - began

    first, total = asyncio.run(timed())
    assert first < total - 0.2


def test_load_unload_and_weights_refused(upstream: ScriptedUpstream) -> None:
    rt = runtime(upstream, "openai")
    first = asyncio.run(rt.load("c1", {"harness/prompt.md": b"x"}))
    second = asyncio.run(rt.load("c1", {"harness/prompt.md": b"x"}))
    assert first != second and first.startswith("upstream:") and first.endswith(":1")
    deltas = collect(rt, ask(), load=first)
    assert {d.runtime_load_id for d in deltas if isinstance(d, TextDelta)} == {first}
    asyncio.run(rt.unload(first))
    with pytest.raises(RuntimeFailure):
        collect(rt, ask(), load=first)
    with pytest.raises(RuntimeFailure, match="weights"):
        asyncio.run(rt.load("c2", {"adapter/adapter_model.safetensors": b"\0"}))


def test_count_tokens(upstream: ScriptedUpstream) -> None:
    request = conversation("openai", False)

    async def count(rt: UpstreamRuntime, request: ChatRequest) -> int:
        try:
            return await rt.count_tokens(request)
        finally:
            await rt.close()

    counted = asyncio.run(count(runtime(upstream, "anthropic"), request))
    sent = upstream.requests[-1]
    assert sent.path == "/v1/messages/count_tokens" and sent.headers["x-api-key"] == KEY
    assert counted == int(sent.headers["content-length"]) // 4 > 0  # what the scripted server answers
    assert not {"max_tokens", "stream", "temperature", "stop_sequences"} & set(sent.body)
    estimate = asyncio.run(count(runtime(upstream, "openai"), ask("x" * 400)))
    assert estimate == 100 + 4 and len(upstream.requests) == 1  # an estimate: no request made


def test_sse_parser_handles_crlf_comments_multiline_and_unicode_separators() -> None:
    raw = [b': hi\r\nevent: a\r\ndata: {"t": "x\xe2\x80', b'\xa8y"}\r\n\r\ndata: line1\ndata: line2\n\n', b"data: tail"]

    async def chunks() -> Any:
        for chunk in raw:
            yield chunk

    async def run() -> list[tuple[str | None, str]]:
        return [event async for event in sse_events(chunks())]

    assert asyncio.run(run()) == [("a", '{"t": "x\u2028y"}'), (None, "line1\nline2"), (None, "tail")]
