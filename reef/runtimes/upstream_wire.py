"""The upstream provider's wire: request bodies in its dialect, and its answers (whole JSON or
SSE) parsed back into Reef's deltas. One function per upstream dialect each way; no I/O.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from reef.core.chat import ChatRequest, Delta, Finish, FinishReason, TextDelta, ToolCall, ToolCallDelta, Usage
from reef.core.errors import InvalidInput

JSON = dict[str, Any]
ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_DEFAULT_MAX_TOKENS = 1024
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # upstream.max_response_bytes
_OPENAI_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "stop",
}
_ANTHROPIC_FINISH: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "refusal": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
}


# -- requests: one function per upstream dialect --


def _tool_choice(choice: Any) -> tuple[str, str | None] | None:
    """Normalise Reef's tool_choice ("auto" | "none" | "required" | {"name": ...}) to (kind, name)."""
    if isinstance(choice, str):
        kind = "required" if choice == "any" else choice
        return (kind, None) if kind in ("auto", "none", "required") else None
    if isinstance(choice, dict):
        name = choice.get("name") or (choice.get("function") or {}).get("name")
        if name:
            return ("tool", str(name))
        return _tool_choice(choice.get("type"))
    return None


def _put(body: JSON, **values: Any) -> None:
    body.update((key, value) for key, value in values.items() if value is not None)


def to_openai_body(request: ChatRequest, model: str) -> JSON:
    """The request as an OpenAI chat-completions body."""
    messages: list[JSON] = []
    for m in request.messages:
        if m.role == "tool":
            messages.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            messages.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    "tool_calls": [
                        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                        for c in m.tool_calls
                    ],
                }
            )
        else:
            msg: JSON = {"role": m.role, "content": m.content}
            if m.name and m.role != "assistant":
                msg["name"] = m.name
            messages.append(msg)
    body: JSON = {"model": model, "messages": messages, "stream": request.stream}
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    **({"description": t.description} if t.description else {}),
                    "parameters": t.parameters,
                },
            }
            for t in request.tools
        ]
        choice = _tool_choice(request.tool_choice)
        if choice is not None:
            kind, name = choice
            body["tool_choice"] = {"type": "function", "function": {"name": name}} if kind == "tool" else kind
    _put(body, max_tokens=request.max_tokens, temperature=request.temperature, top_p=request.top_p, seed=request.seed)
    if request.stop:
        body["stop"] = list(request.stop)
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _arguments_object(call: ToolCall) -> JSON:
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidInput(f"tool call {call.id} ({call.name}): arguments must be a JSON object")
    return value


def to_anthropic_body(request: ChatRequest, model: str) -> JSON:
    """The request as an Anthropic messages body: system hoisted, tool results as user turns,
    consecutive same-role turns merged, max_tokens always present."""
    system: list[str] = []
    turns: list[JSON] = []
    for m in request.messages:
        blocks: list[JSON]
        if m.role == "system":
            if m.content:
                system.append(m.content)
            continue
        if m.role == "tool":
            role, blocks = "user", [{"type": "tool_result", "tool_use_id": m.tool_call_id or "", "content": m.content}]
        elif m.role == "assistant":
            role = "assistant"
            blocks = [{"type": "text", "text": m.content}] if m.content or not m.tool_calls else []
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": _arguments_object(c)} for c in m.tool_calls
            ]
        else:
            role, blocks = "user", [{"type": "text", "text": m.content}]
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:
        content = turn["content"]
        if len(content) == 1 and content[0]["type"] == "text":
            turn["content"] = content[0]["text"]
    body: JSON = {
        "model": model,
        "messages": turns,
        "max_tokens": request.max_tokens if request.max_tokens is not None else ANTHROPIC_DEFAULT_MAX_TOKENS,
        "stream": request.stream,
    }
    if system:
        body["system"] = "\n\n".join(system)
    if request.tools:
        body["tools"] = [
            {"name": t.name, **({"description": t.description} if t.description else {}), "input_schema": t.parameters}
            for t in request.tools
        ]
        choice = _tool_choice(request.tool_choice)
        if choice is not None:
            kind, name = choice
            body["tool_choice"] = (
                {"type": "tool", "name": name} if kind == "tool" else {"type": {"required": "any"}.get(kind, kind)}
            )
    _put(body, temperature=request.temperature, top_p=request.top_p)
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    return body


# -- responses --


class UpstreamProblem(Exception):
    """Raised by the parsers; the runtime turns it into a scrubbed RuntimeFailure (502)."""


class AnswerTooLarge(UpstreamProblem):
    """An answer, or one event of a stream, passed the configured byte limit."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(
            f"sent {what} larger than upstream.max_response_bytes ({limit} bytes); raise that "
            "setting if this provider's answers are legitimately this large"
        )


def loads_json(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        snippet = text[:120] if isinstance(text, str) else text[:120].decode("utf-8", "replace")
        raise UpstreamProblem(f"sent malformed JSON: {snippet!r}") from None


class SSEParser:
    """Incremental server-sent-event parser: `feed(bytes)` returns the (event, data) pairs that
    chunk completes. Lines split on LF (CRLF tolerated) only, as the SSE spec says, so U+2028
    and friends inside JSON text cannot break a line; comments and fields other than
    event/data are ignored. One event (its data lines, and the line still arriving) may hold
    at most `max_event_bytes`: past that, `AnswerTooLarge`, without buffering the rest (a
    line that arrived whole in one chunk is decoded before it is counted: the chunk is
    already in memory, and the runtime bounds the stream as a whole)."""

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self._max_event_bytes = max_event_bytes
        self._partial: list[bytes] = []  # an unfinished line, in the pieces it arrived in
        self._partial_size = 0
        self._event: str | None = None
        self._data: list[str] = []
        self._data_size = 0

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        *lines, rest = chunk.split(b"\n")
        if not lines:  # mid-line: keep the piece; joining on every read would copy quadratically
            self._hold(rest)
            return []
        if self._partial:
            lines[0] = b"".join(self._partial) + lines[0]
            self._partial, self._partial_size = [], 0
        out: list[tuple[str | None, str]] = []
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if self._data:
                    out.append((self._event, "\n".join(self._data)))
                    self._data, self._data_size = [], 0
                self._event = None
            elif not line.startswith(b":"):
                self._field(line)
        if rest:
            self._hold(rest)
        return out

    def close(self) -> list[tuple[str | None, str]]:
        """What an unterminated last event holds, when the stream ends."""
        tail = b"".join(self._partial)
        self._partial, self._partial_size = [], 0
        if tail.strip():
            self._field(tail.rstrip(b"\r"))
        out = [(self._event, "\n".join(self._data))] if self._data else []
        self._event, self._data, self._data_size = None, [], 0
        return out

    def _hold(self, piece: bytes) -> None:
        self._partial_size += len(piece)
        if self._data_size + self._partial_size > self._max_event_bytes:
            raise AnswerTooLarge("one server-sent event", self._max_event_bytes)
        self._partial.append(piece)

    def _field(self, line: bytes) -> None:
        name, _, value = line.decode("utf-8", "replace").partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data_size += len(line)
            if self._data_size > self._max_event_bytes:
                raise AnswerTooLarge("one server-sent event", self._max_event_bytes)
            self._data.append(value)
        elif name == "event":
            self._event = value


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[str | None, str]]:
    """(event, data) pairs of a server-sent-event stream (see `SSEParser`)."""
    parser = SSEParser()
    async for chunk in chunks:
        for item in parser.feed(chunk):
            yield item
    for item in parser.close():
        yield item


def coalesce_text(deltas: list[Delta]) -> list[Delta]:
    """Adjacent text deltas of one network read as one: the client gets one chunk per read,
    not one per upstream event (each chunk costs a write on both sides)."""
    out: list[Delta] = []
    for delta in deltas:
        last = out[-1] if out else None
        if (
            isinstance(delta, TextDelta)
            and isinstance(last, TextDelta)
            and not delta.token_ids
            and not last.token_ids
            and delta.runtime_load_id == last.runtime_load_id
        ):
            out[-1] = TextDelta(last.text + delta.text, runtime_load_id=last.runtime_load_id)
        else:
            out.append(delta)
    return out


class _Stream:
    """Shared bookkeeping of a parsed answer."""

    def __init__(self, load_id: str | None) -> None:
        self.load_id = load_id
        self.usage = Usage()
        self.model: str | None = None
        self.reason: FinishReason | None = None
        self.done = False
        self.calls_emitted = 0

    def text(self, text: str) -> TextDelta:
        return TextDelta(text, runtime_load_id=self.load_id)

    def call(self, call_id: str, name: str, arguments: str) -> ToolCallDelta:
        delta = ToolCallDelta(
            ToolCall(call_id or f"call_{self.calls_emitted}", name, arguments or "{}"), index=self.calls_emitted
        )
        self.calls_emitted += 1
        return delta

    def finish(self) -> Finish:
        reason: FinishReason = self.reason or "stop"
        if reason == "stop" and self.calls_emitted:
            reason = "tool_calls"  # some servers say "stop" after emitting calls
        self.done = True
        return Finish(reason, self.usage, self.model)

    def end(self) -> list[Delta]:
        """The stream closed without its terminator: finish if the upstream did say why it stopped."""
        if self.reason is None:
            raise UpstreamProblem("stream ended before the answer finished")
        return self.flush() + [self.finish()]

    def flush(self) -> list[Delta]:
        return []


class OpenAIStream(_Stream):
    def __init__(self, load_id: str | None) -> None:
        super().__init__(load_id)
        self.pending: dict[int, list[Any]] = {}  # index -> [id, name, [argument fragments]]
        self.closed: set[int] = set()

    def feed(self, event: str | None, data: str) -> list[Delta]:
        if data.strip() == "[DONE]":
            return self.flush() + [self.finish()]
        chunk = loads_json(data)
        if not isinstance(chunk, dict):
            raise UpstreamProblem("sent a stream chunk that is not a JSON object")
        if chunk.get("error"):
            raise UpstreamProblem(f"reported an error mid-stream: {error_text(chunk)[0]}")
        self.model = chunk.get("model") or self.model
        if chunk.get("usage"):
            self.usage = _openai_usage(chunk["usage"])
        out: list[Delta] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out.append(self.text(delta["content"]))
            for fragment in delta.get("tool_calls") or ():
                index = int(fragment.get("index", 0))
                if index in self.closed:
                    continue
                out.extend(self.flush(below=index))
                slot = self.pending.setdefault(index, ["", "", []])
                function = fragment.get("function") or {}
                slot[0] = fragment.get("id") or slot[0]
                slot[1] = function.get("name") or slot[1]
                if function.get("arguments"):
                    slot[2].append(function["arguments"])
            if choice.get("finish_reason"):
                self.reason = _OPENAI_FINISH.get(choice["finish_reason"], "stop")
                out.extend(self.flush())
        return out

    def flush(self, below: int | None = None) -> list[Delta]:
        out: list[Delta] = []
        for index in sorted(i for i in self.pending if below is None or i < below):
            call_id, name, parts = self.pending.pop(index)
            self.closed.add(index)
            out.append(self.call(call_id, name, "".join(parts)))
        return out

    def whole(self, body: Any) -> list[Delta]:
        if not isinstance(body, dict) or not body.get("choices"):
            raise UpstreamProblem("answered without choices")
        self.model = body.get("model")
        self.usage = _openai_usage(body.get("usage") or {})
        choice = body["choices"][0]
        message = choice.get("message") or {}
        out: list[Delta] = [self.text(message["content"])] if message.get("content") else []
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            out.append(self.call(call.get("id", ""), function.get("name", ""), function.get("arguments", "")))
        self.reason = _OPENAI_FINISH.get(choice.get("finish_reason") or "stop", "stop")
        return out + [self.finish()]


class AnthropicStream(_Stream):
    def __init__(self, load_id: str | None) -> None:
        super().__init__(load_id)
        self.blocks: dict[int, list[Any]] = {}  # index -> [id, name, [partial_json], start input]

    def take_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        prompt, completion = self.usage.prompt_tokens, self.usage.completion_tokens
        if usage.get("input_tokens") is not None:
            prompt = sum(
                int(usage.get(k) or 0)
                for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
            )
        if usage.get("output_tokens") is not None:
            completion = int(usage["output_tokens"])
        self.usage = Usage(prompt, completion)

    def feed(self, event: str | None, data: str) -> list[Delta]:
        message = loads_json(data)
        if not isinstance(message, dict):
            raise UpstreamProblem("sent a stream event that is not a JSON object")
        kind = message.get("type") or event
        out: list[Delta] = []
        if kind == "error":
            raise UpstreamProblem(f"reported an error mid-stream: {error_text(message)[0]}")
        if kind == "message_start":
            start = message.get("message") or {}
            self.model = start.get("model")
            self.take_usage(start.get("usage"))
        elif kind == "content_block_start":
            block = message.get("content_block") or {}
            if block.get("type") == "tool_use":
                self.blocks[message.get("index", 0)] = [
                    block.get("id", ""),
                    block.get("name", ""),
                    [],
                    block.get("input"),
                ]
            elif block.get("type") == "text" and block.get("text"):
                out.append(self.text(block["text"]))
        elif kind == "content_block_delta":
            delta = message.get("delta") or {}
            if delta.get("type") == "text_delta" and delta.get("text"):
                out.append(self.text(delta["text"]))
            elif delta.get("type") == "input_json_delta" and message.get("index", 0) in self.blocks:
                self.blocks[message.get("index", 0)][2].append(delta.get("partial_json") or "")
        elif kind == "content_block_stop":
            out.extend(self.flush(message.get("index", 0)))
        elif kind == "message_delta":
            stop = (message.get("delta") or {}).get("stop_reason")
            if stop:
                self.reason = _ANTHROPIC_FINISH.get(stop, "stop")
            self.take_usage(message.get("usage"))
        elif kind == "message_stop":
            out.extend(self.flush())
            out.append(self.finish())
        return out  # ping and unknown events carry nothing

    def flush(self, index: int | None = None) -> list[Delta]:
        out: list[Delta] = []
        for i in sorted(self.blocks) if index is None else [index]:
            if i in self.blocks:
                call_id, name, parts, start = self.blocks.pop(i)
                out.append(self.call(call_id, name, "".join(parts) or json.dumps(start or {})))
        return out

    def whole(self, body: Any) -> list[Delta]:
        if not isinstance(body, dict) or not isinstance(body.get("content"), list):
            raise UpstreamProblem("answered without content")
        self.model = body.get("model")
        self.take_usage(body.get("usage"))
        out: list[Delta] = []
        for block in body["content"]:
            if block.get("type") == "text" and block.get("text"):
                out.append(self.text(block["text"]))
            elif block.get("type") == "tool_use":
                out.append(self.call(block.get("id", ""), block.get("name", ""), json.dumps(block.get("input") or {})))
        self.reason = _ANTHROPIC_FINISH.get(body.get("stop_reason") or "end_turn", "stop")
        return out + [self.finish()]


def _openai_usage(usage: Any) -> Usage:
    if not isinstance(usage, dict):
        return Usage()
    return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


def error_text(body: Any) -> tuple[str, str | None]:
    """(message, type) from an OpenAI, Anthropic or vLLM-style error body."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message") or json.dumps(error)[:500]), error.get("type") and str(error["type"])
        if isinstance(error, str):
            return error, None
        if body.get("message") or body.get("detail"):
            return str(body.get("message") or body.get("detail")), body.get("type") and str(body["type"])
    return json.dumps(body)[:500], None
