"""The OpenAI Chat Completions wire format: one conversion in, one out.

`parse_chat_request` turns a request body into Reef's `ChatRequest`; `chat_completion` and
`ChunkEncoder` turn a `ChatResult` or a stream of deltas back into the bodies and SSE chunks
the official `openai` SDK parses. No I/O here. Every top-level field the SDK knows is decided in
`SUPPORTED`, `IGNORED` or `REFUSED` (a 400 unless the value is the neutral default); fields
newer than this table are ignored. docs/wire.md has the same table with the reasons.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from reef.core.chat import ChatRequest, ChatResult, Delta, Finish, Message, TextDelta, Tool, ToolCall, ToolCallDelta
from reef.core.errors import InvalidInput
from reef.serve.tool_policy import ToolPolicy, UnsupportedTools
from reef.serve.wire_validation import check_body, validate_wire

SUPPORTED = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "n",
        "stream",
        "stream_options",
        "seed",
    }
)
IGNORED = frozenset(
    {
        "user",
        "metadata",
        "store",
        "parallel_tool_calls",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "reasoning_effort",
        "verbosity",
    }
)
# field -> (is the value neutral?, why anything else is refused)
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "logit_bias": (lambda v: not v, "token biasing is not supported"),
    "logprobs": (lambda v: v is None or v is False, "log-probabilities are not returned; send false or omit it"),
    "top_logprobs": (lambda v: v is None or v == 0, "log-probabilities are not returned"),
    "response_format": (
        lambda v: v is None or v == {"type": "text"},
        "only {'type': 'text'} is supported; Reef does not constrain output to JSON",
    ),
    "functions": (lambda v: v is None, "legacy functions are not supported; use tools"),
    "function_call": (lambda v: v is None, "legacy function_call is not supported; use tool_choice"),
    "frequency_penalty": (lambda v: v is None or v == 0, "penalties are not supported; send 0 or omit it"),
    "presence_penalty": (lambda v: v is None or v == 0, "penalties are not supported; send 0 or omit it"),
    "audio": (lambda v: v is None, "audio output is not supported"),
    "modalities": (lambda v: v is None or v == ["text"], "only the text modality is supported"),
    "prediction": (lambda v: v is None, "predicted outputs are not supported"),
    "web_search_options": (lambda v: v is None, "web search is not supported"),
    "moderation": (lambda v: v is None, "moderated completions are not supported"),
}
DONE = b"data: [DONE]\n\n"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _StreamOptions(_Wire):
    include_usage: bool | None = None


class _Body(_Wire):
    model: str = Field(min_length=1)
    messages: list[Any] = Field(min_length=1)
    tools: list[Any] | None = None
    tool_choice: Any = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: Any = None
    n: int | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    seed: int | None = None


class _MessageIn(_Wire):
    role: str
    content: Any = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


class _FunctionCallIn(_Wire):
    name: str = Field(min_length=1)
    arguments: str


class _ToolCallIn(_Wire):
    id: str = Field(min_length=1)
    type: str = "function"
    function: _FunctionCallIn


class _FunctionDef(_Wire):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # accepted and ignored: Reef does not constrain decoding


class _ToolIn(_Wire):
    type: str
    function: _FunctionDef


class _TextPart(_Wire):
    type: str
    text: str


_validate = validate_wire  # shared with the other dialect: errors name the field path


def parse_chat_request(body: Any, unsupported_tools: UnsupportedTools = "drop") -> ChatRequest:
    """Validate an OpenAI chat completions body into a `ChatRequest` (dialect "openai"); tools
    other than functions are left out or refused as `unsupported_tools` says."""
    check_body(body, REFUSED)
    b: _Body = _validate(_Body, body, "")
    if b.n is not None and b.n != 1:
        raise InvalidInput("n: Reef returns exactly one choice; n must be 1")
    if b.max_tokens is not None and b.max_completion_tokens is not None and b.max_tokens != b.max_completion_tokens:
        raise InvalidInput("max_tokens: disagrees with max_completion_tokens; send one of them")
    stop = [b.stop] if isinstance(b.stop, str) else (b.stop or [])
    if not isinstance(stop, list):
        raise InvalidInput("stop: must be a string or a list of strings")
    if len(stop) > 4:
        raise InvalidInput("stop: at most 4 stop sequences")
    for j, s in enumerate(stop):
        if not isinstance(s, str) or not s:
            raise InvalidInput(f"stop[{j}]: must be a non-empty string")
    policy = ToolPolicy(unsupported_tools)
    tools = tuple(t for i, raw in enumerate(b.tools or []) if (t := _tool(raw, i, policy)) is not None)
    return ChatRequest(
        model=b.model,
        messages=tuple(_message(raw, i) for i, raw in enumerate(b.messages)),
        dialect="openai",
        tools=tools,
        tool_choice=parse_tool_choice(b.tool_choice, tools),
        max_tokens=b.max_completion_tokens if b.max_completion_tokens is not None else b.max_tokens,
        temperature=b.temperature,
        top_p=b.top_p,
        stop=tuple(stop),
        stream=bool(b.stream),
        seed=b.seed,
        dropped_tools=tuple(policy.dropped),
    )


def stream_include_usage(body: dict[str, Any]) -> bool:
    """Whether a (parsed, valid) body asked for the usage chunk: `stream_options.include_usage`."""
    options = body.get("stream_options") or {}
    return bool(body.get("stream")) and bool(options.get("include_usage"))


def _text(content: Any, path: str, *, assistant: bool = False) -> str:
    """A message's text: a string, or text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput(f"{path}: must be a string or a list of content parts")
    texts: list[str] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(_validate(_TextPart, part, f"{path}[{j}]").text)
        elif kind == "refusal" and assistant and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in ("image_url", "input_audio", "file"):
            raise InvalidInput(f"{path}[{j}].type: {kind!r} parts are not supported; Reef serves text only")
        else:
            raise InvalidInput(f"{path}[{j}].type: expected a text part, got {kind!r}")
    return "\n".join(texts)


def _message(raw: Any, i: int) -> Message:
    path = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise InvalidInput(f"{path}: must be an object")
    m: _MessageIn = _validate(_MessageIn, raw, path)
    role = "system" if m.role == "developer" else m.role
    if role in ("system", "user", "tool"):
        if m.content is None:
            raise InvalidInput(f"{path}.content: Field required")
        text = _text(m.content, f"{path}.content")
        if role != "tool":
            return Message(role=role, content=text, name=m.name)
        if not m.tool_call_id:
            raise InvalidInput(f"{path}.tool_call_id: Field required")
        return Message(role="tool", content=text, tool_call_id=m.tool_call_id, name=m.name)
    if role == "assistant":
        for legacy in ("function_call", "audio"):
            if raw.get(legacy) is not None:
                raise InvalidInput(f"{path}.{legacy}: not supported")
        text = "" if m.content is None else _text(m.content, f"{path}.content", assistant=True)
        calls = tuple(_tool_call(c, f"{path}.tool_calls[{j}]") for j, c in enumerate(m.tool_calls or []))
        if m.content is None and not calls and m.refusal is None:
            raise InvalidInput(f"{path}.content: required unless tool_calls is given")
        return Message(role="assistant", content=text or (m.refusal or ""), tool_calls=calls, name=m.name)
    if role == "function":
        raise InvalidInput(f"{path}.role: legacy 'function' messages are not supported; use 'tool'")
    raise InvalidInput(f"{path}.role: unknown role {m.role!r}")


def _tool_call(raw: Any, path: str) -> ToolCall:
    c: _ToolCallIn = _validate(_ToolCallIn, raw, path)
    if c.type != "function":
        raise InvalidInput(f"{path}.type: only function tool calls are supported, got {c.type!r}")
    return ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)


def _tool(raw: Any, i: int, policy: ToolPolicy) -> Tool | None:
    path = f"tools[{i}]"
    if isinstance(raw, dict) and raw.get("type") != "function":
        policy.unsupported(raw.get("type"), path)  # e.g. a `custom` tool: left out, or a 400
        return None
    t: _ToolIn = _validate(_ToolIn, raw, path)
    f = t.function
    if f.parameters is None:
        return Tool(name=f.name, description=f.description)
    return Tool(name=f.name, description=f.description, parameters=f.parameters)


def parse_tool_choice(raw: Any, tools: tuple[Tool, ...], *, nested: bool = True) -> Any:
    """OpenAI's tool_choice: "none" | "auto" | "required" | a named function, whose name is under
    `function` in chat completions (`nested`) and at the top in the Responses API."""
    if raw is None or raw in ("auto", "none"):
        return raw
    if raw == "required":
        if not tools:
            raise InvalidInput("tool_choice: 'required' needs tools")
        return raw
    where = "tool_choice.function.name" if nested else "tool_choice.name"
    if not isinstance(raw, dict):
        raise InvalidInput("tool_choice: must be 'none', 'auto', 'required' or a named function")
    if raw.get("type") != "function":
        raise InvalidInput(f"tool_choice.type: only 'function' is supported, got {raw.get('type')!r}")
    holder = raw.get("function") if nested else raw
    name = holder.get("name") if isinstance(holder, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{where}: Field required")
    if name not in {t.name for t in tools}:
        raise InvalidInput(f"{where}: no tool named {name!r}")
    return {"name": name}


# -- responses --------------------------------------------------------------------------------


def _tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_completion(result: ChatResult, *, completion_id: str, created: int, model: str) -> dict[str, Any]:
    """The non-streaming body. A result that finished with "error" must be answered with an
    error status instead; handing one here is a bug (ValueError)."""
    if result.finish_reason == "error":
        raise ValueError("a result that finished with 'error' has no chat.completion body")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": result.text if result.text or not result.tool_calls else None,
        "refusal": None,
    }
    if result.tool_calls:
        message["tool_calls"] = [_tool_call_json(c) for c in result.tool_calls]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": result.finish_reason}],
        "usage": _usage(result.usage.prompt_tokens, result.usage.completion_tokens),
    }


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def sse(obj: dict[str, Any]) -> bytes:
    """One SSE frame: `data: {json}` and a blank line."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class ChunkEncoder:
    """Turns deltas into `chat.completion.chunk` objects; frame each with `sse`, end with `DONE`.

    Order: `first()`, `encode(delta)` for each delta (the `Finish` gives the finish_reason chunk
    and, with include_usage, a usage chunk with `choices: []`), `reef_chunk(...)`, then DONE.
    The reef chunk repeats the usage: the SDK's stream accumulator keeps the last chunk's.
    A `Finish("error")` becomes an in-stream `{"error": ...}` object, which the SDK raises.
    """

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool = False) -> None:
        self.completion_id = completion_id
        self.created = created
        self.model = model
        self.include_usage = include_usage
        self._usage: dict[str, int] | None = None

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI sends it on every chunk but the last
        return chunk

    def _choice(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return self._chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}])

    def first(self) -> dict[str, Any]:
        return self._choice({"role": "assistant", "content": ""})

    def encode(self, delta: Delta) -> list[dict[str, Any]]:
        if isinstance(delta, TextDelta):
            return [self._choice({"content": delta.text})] if delta.text else []
        if isinstance(delta, ToolCallDelta):
            return [self._choice({"tool_calls": [{"index": delta.index, **_tool_call_json(delta.call)}]})]
        if not isinstance(delta, Finish):
            raise TypeError(f"not a delta: {delta!r}")
        if delta.reason == "error":
            return [error_body("the model runtime failed while streaming", "server_error")]
        out = [self._choice({}, delta.reason)]
        if self.include_usage:
            usage = self._chunk([])
            usage["usage"] = self._usage = _usage(delta.usage.prompt_tokens, delta.usage.completion_tokens)
            out.append(usage)
        return out

    def reef_chunk(self, agent_record_id: str, release_id: str, verified: bool) -> dict[str, Any]:
        chunk = reef_chunk(
            agent_record_id,
            release_id,
            verified,
            completion_id=self.completion_id,
            created=self.created,
            model=self.model,
        )
        if self.include_usage:  # the SDK's accumulator keeps the usage of the last chunk
            chunk["usage"] = self._usage
        return chunk


def reef_chunk(
    agent_record_id: str, release_id: str, verified: bool, *, completion_id: str = "", created: int = 0, model: str = ""
) -> dict[str, Any]:
    """Reef's last chunk before DONE: no choices, the receipt under `reef`."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "reef": {"agent_record_id": agent_record_id, "release_id": release_id, "verified": verified},
    }
