"""The Anthropic Messages wire format: one conversion in, one out.

`parse_messages_request` (and `parse_count_tokens_request`) turn a request body into Reef's
`ChatRequest`; `message_response` and `EventEncoder` turn a `ChatResult` or a stream of deltas
back into the bodies and SSE events the official `anthropic` SDK parses. No I/O here. Every
top-level field the SDK knows (including the beta endpoint's) is decided in `SUPPORTED`,
`IGNORED` or `REFUSED` (a 400 unless the value is the neutral default); fields newer than this
table are ignored. docs/wire.md has the same table with the reasons.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from reef.core.chat import ChatRequest, ChatResult, Delta, Finish, Message, TextDelta, Tool, ToolCall, ToolCallDelta
from reef.core.errors import InvalidInput
from reef.serve.wire_validation import check_body, validate_wire

SUPPORTED = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "stream",
    }
)
IGNORED = frozenset(
    {
        "metadata",
        "thinking",
        "cache_control",
        "diagnostics",
        "inference_geo",
        "service_tier",
        "speed",
        "user_profile_id",
        "workspace_id",
        "context_management",
        "billing_policy",
        "fallbacks",
        "fallback_credit_token",
        "betas",
    }
)
# field -> (is the value neutral?, why anything else is refused)
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "top_k": (lambda v: v is None, "top-k sampling is not supported; use temperature or top_p"),
    "output_config": (
        lambda v: not v or not (v.get("format") if isinstance(v, dict) else True),
        "a format is not supported; Reef does not constrain output to JSON (effort alone is ignored)",
    ),
    "output_format": (lambda v: v is None, "structured output is not supported"),
    "container": (lambda v: v is None, "server-side containers are not supported"),
    "mcp_servers": (lambda v: not v, "MCP servers are not supported; send the tools themselves"),
    "compaction": (lambda v: v is None, "compaction requests are not supported"),
    "thread": (lambda v: v is None, "server-held threads are not supported; send the whole conversation"),
}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_DROPPED_BLOCKS = ("thinking", "redacted_thinking")  # earlier reasoning in assistant turns


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _ToolChoice(_Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None  # accepted and ignored


class _Body(_Wire):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    messages: list[Any] = Field(min_length=1)
    system: Any = None
    tools: list[Any] | None = None
    tool_choice: _ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool | None = None


class _MessageIn(_Wire):
    role: str
    content: Any


class _TextBlock(_Wire):
    type: str
    text: str


class _ToolUse(_Wire):
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class _ToolResult(_Wire):
    tool_use_id: str = Field(min_length=1)
    content: Any = None
    is_error: bool | None = None  # accepted and ignored: the content carries the error text


class _ToolIn(_Wire):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


_validate = validate_wire  # shared with the other dialect: errors name the field path


def parse_messages_request(body: Any) -> ChatRequest:
    """Validate an Anthropic messages body into a `ChatRequest` (dialect "anthropic")."""
    return _parse(body, require_max_tokens=True)


def parse_count_tokens_request(body: Any) -> ChatRequest:
    """The same for `/v1/messages/count_tokens`, where max_tokens is not required."""
    return _parse(body, require_max_tokens=False)


def _parse(body: Any, *, require_max_tokens: bool) -> ChatRequest:
    check_body(body, REFUSED)
    b: _Body = _validate(_Body, body, "")
    if require_max_tokens and b.max_tokens is None:
        raise InvalidInput("max_tokens: Field required")
    for j, s in enumerate(b.stop_sequences or []):
        if not s:
            raise InvalidInput(f"stop_sequences[{j}]: must not be empty")
    messages: list[Message] = []
    if b.system is not None:
        system = _text(b.system, "system")
        if system:
            messages.append(Message(role="system", content=system))
    for i, raw in enumerate(b.messages):
        messages.extend(_turn(raw, i))
    tools = tuple(_tool(raw, i) for i, raw in enumerate(b.tools or []))
    return ChatRequest(
        model=b.model,
        messages=tuple(messages),
        dialect="anthropic",
        tools=tools,
        tool_choice=_tool_choice(b.tool_choice, tools),
        max_tokens=b.max_tokens,
        temperature=b.temperature,
        top_p=b.top_p,
        stop=tuple(b.stop_sequences or ()),
        stream=bool(b.stream),
    )


def _block_type(block: Any, path: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise InvalidInput(f"{path}.type: Field required")
    return kind


def _unsupported(kind: str, path: str) -> InvalidInput:
    if kind in ("image", "document", "search_result"):
        return InvalidInput(f"{path}.type: {kind!r} blocks are not supported; Reef serves text only")
    return InvalidInput(f"{path}.type: {kind!r} blocks are not supported here")


def _text(content: Any, path: str) -> str:
    """Text of a string or a list of text blocks, joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput(f"{path}: must be a string or a list of content blocks")
    texts = []
    for j, block in enumerate(content):
        kind = _block_type(block, f"{path}[{j}]")
        if kind != "text":
            raise _unsupported(kind, f"{path}[{j}]")
        texts.append(_validate(_TextBlock, block, f"{path}[{j}]").text)
    return "\n".join(texts)


def _turn(raw: Any, i: int) -> list[Message]:
    """One wire turn as Reef messages: a user turn's tool_result blocks each become a tool
    message, in order, and the text blocks between them user messages."""
    path = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise InvalidInput(f"{path}: must be an object")
    m: _MessageIn = _validate(_MessageIn, raw, path)
    if m.role == "system":
        return [Message(role="system", content=_text(m.content, f"{path}.content"))]
    if m.role not in ("user", "assistant"):
        raise InvalidInput(f"{path}.role: must be 'user' or 'assistant', got {m.role!r}")
    if isinstance(m.content, str):
        return [Message(role=m.role, content=m.content)]
    if not isinstance(m.content, list):
        raise InvalidInput(f"{path}.content: must be a string or a list of content blocks")
    out: list[Message] = []
    texts: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(m.content):
        where = f"{path}.content[{j}]"
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(_validate(_TextBlock, block, where).text)
        elif kind == "tool_use" and m.role == "assistant":
            use: _ToolUse = _validate(_ToolUse, block, where)
            calls.append(ToolCall(id=use.id, name=use.name, arguments=json.dumps(use.input)))
        elif kind == "tool_result" and m.role == "user":
            result: _ToolResult = _validate(_ToolResult, block, where)
            if texts:
                out.append(Message(role="user", content="\n".join(texts)))
                texts = []
            content = "" if result.content is None else _text(result.content, f"{where}.content")
            out.append(Message(role="tool", content=content, tool_call_id=result.tool_use_id))
        elif kind in _DROPPED_BLOCKS and m.role == "assistant":
            continue
        else:
            raise _unsupported(kind, where)
    if m.role == "assistant":
        return [Message(role="assistant", content="\n".join(texts), tool_calls=tuple(calls))]
    if texts or not out:
        out.append(Message(role="user", content="\n".join(texts)))
    return out


def _tool(raw: Any, i: int) -> Tool:
    path = f"tools[{i}]"
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in (None, "custom"):
        raise InvalidInput(f"{path}.type: server tool {kind!r} is not supported; only custom tools are")
    t: _ToolIn = _validate(_ToolIn, raw, path)
    return Tool(name=t.name, description=t.description, parameters=t.input_schema)


def _tool_choice(choice: _ToolChoice | None, tools: tuple[Tool, ...]) -> Any:
    if choice is None:
        return None
    if choice.type in ("auto", "none"):
        return choice.type
    if not tools:
        raise InvalidInput(f"tool_choice.type: {choice.type!r} needs tools")
    if choice.type == "any":
        return "required"
    if not choice.name:
        raise InvalidInput("tool_choice.name: Field required")
    if choice.name not in {t.name for t in tools}:
        raise InvalidInput(f"tool_choice.name: no tool named {choice.name!r}")
    return {"name": choice.name}


# -- responses --------------------------------------------------------------------------------


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's JSON text as Anthropic's `input` object: empty text is `{}`; text that is
    not a JSON object is kept whole as `{"raw": text}`."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"raw": arguments}
    return value if isinstance(value, dict) else {"raw": arguments}


def _stop_reason(reason: str) -> str:
    if reason not in _STOP_REASONS:
        raise ValueError(f"a result that finished with {reason!r} has no message body")
    return _STOP_REASONS[reason]


def message_response(result: ChatResult, *, message_id: str, model: str) -> dict[str, Any]:
    """The non-streaming body. `stop_reason` is never "stop_sequence": the result does not say
    whether a stop sequence matched, so a stop is `end_turn`."""
    content: list[dict[str, Any]] = []
    if result.text:
        content.append({"type": "text", "text": result.text})
    for call in result.tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call.arguments)})
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _stop_reason(result.finish_reason),
        "stop_sequence": None,
        "usage": {"input_tokens": result.usage.prompt_tokens, "output_tokens": result.usage.completion_tokens},
    }


def count_tokens_response(input_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens}


def error_body(type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type, "message": message}}


def event(kind: str, data: dict[str, Any]) -> bytes:
    """One SSE frame: `event: <kind>`, `data: {json}` and a blank line."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {payload}\n\n".encode()


class EventEncoder:
    """Turns deltas into Anthropic stream events, already framed as SSE bytes.

    Order: `start()`, `encode(delta)` for each delta, then `stop(reef)`. Text opens a text
    block lazily; each tool call is one whole tool_use block (start, one input_json_delta,
    stop); the `Finish` closes any open block and sends message_delta. A `Finish("error")`
    becomes an `error` event, which the SDK raises.
    """

    def __init__(self, message_id: str, model: str, input_tokens: int = 0) -> None:
        self.message_id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self._index = -1  # index of the last block opened
        self._text_open = False

    def start(self) -> list[bytes]:
        usage = {"input_tokens": self.input_tokens, "output_tokens": 0}
        message = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        return [event("message_start", {"type": "message_start", "message": message}), event("ping", {"type": "ping"})]

    def _close(self) -> list[bytes]:
        if not self._text_open:
            return []
        self._text_open = False
        return [event("content_block_stop", {"type": "content_block_stop", "index": self._index})]

    def _open(self, block: dict[str, Any]) -> bytes:
        self._index += 1
        data = {"type": "content_block_start", "index": self._index, "content_block": block}
        return event("content_block_start", data)

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def encode(self, delta: Delta) -> list[bytes]:
        if isinstance(delta, TextDelta):
            if not delta.text:
                return []
            out = [] if self._text_open else [self._open({"type": "text", "text": ""})]
            self._text_open = True
            return out + [self._delta({"type": "text_delta", "text": delta.text})]
        if isinstance(delta, ToolCallDelta):
            call = delta.call
            out = self._close()
            out.append(self._open({"type": "tool_use", "id": call.id, "name": call.name, "input": {}}))
            partial = json.dumps(tool_input(call.arguments), ensure_ascii=False)
            out.append(self._delta({"type": "input_json_delta", "partial_json": partial}))
            out.append(event("content_block_stop", {"type": "content_block_stop", "index": self._index}))
            return out
        if not isinstance(delta, Finish):
            raise TypeError(f"not a delta: {delta!r}")
        if delta.reason == "error":
            return [event("error", error_body("api_error", "the model runtime failed while streaming"))]
        usage: dict[str, int] = {"output_tokens": delta.usage.completion_tokens}
        if delta.usage.prompt_tokens:
            usage["input_tokens"] = delta.usage.prompt_tokens
        body = {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(delta.reason), "stop_sequence": None},
            "usage": usage,
        }
        return self._close() + [event("message_delta", body)]

    def stop(self, reef: dict[str, Any] | None = None) -> bytes:
        """message_stop, carrying Reef's receipt: `{agent_record_id, release_id, verified}`."""
        data: dict[str, Any] = {"type": "message_stop"}
        if reef is not None:
            data["reef"] = reef
        return event("message_stop", data)
