"""The OpenAI Responses API wire format (`POST /v1/responses`): one conversion in, one out.

`parse_responses_request` turns a request body (`input` items, `instructions`, function
`tools`, and the functions of `namespace` tools, served under their own names and called back
with their namespace) into Reef's `ChatRequest`; `reef/serve/responses_events.py` turns the answer back into the
`response` object and the SSE events the official `openai` SDK parses. No I/O here. Every top-level field the SDK knows is decided in
`SUPPORTED`, `IGNORED` or `REFUSED` (a 400 unless the value is the neutral default); fields
newer than this table are ignored. docs/wire.md has the same table with the reasons.

Reef is stateless on this route: it keeps no response to continue from, so
`previous_response_id`, `conversation`, `background`, stored `prompt`s and `item_reference`
inputs are refused; the client sends the whole conversation in `input`, as Codex CLI does.

A `response` object repeats some request settings back (`instructions`, `tools`,
`tool_choice`, `max_output_tokens`, ...). The dialect interface hands the response builders
only the result, so `parse_responses_request` leaves those settings in a context variable of
the request's task (`ECHO`), which the builders read; without one they echo the defaults.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from reef.core.chat import (
    ChatRequest,
    Message,
    Tool,
    ToolCall,
)
from reef.core.errors import InvalidInput
from reef.serve.openai_wire import parse_tool_choice
from reef.serve.tool_policy import ToolPolicy, UnsupportedTools
from reef.serve.wire_validation import check_body, validate_wire

SUPPORTED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
    }
)
IGNORED = frozenset(
    {
        "metadata",
        "user",
        "safety_identifier",
        "service_tier",
        "store",
        "parallel_tool_calls",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "reasoning",
        "include",
        "truncation",
        "max_tool_calls",
        "stream_options",
        "context_management",
        "access_programs",
        "image",
    }
)


def _plain_text_config(v: Any) -> bool:
    if v is None:
        return True
    if not isinstance(v, dict):
        return False
    fmt = v.get("format")
    return fmt is None or fmt == {"type": "text"}


# field -> (is the value neutral?, why anything else is refused)
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "previous_response_id": (
        lambda v: v is None,
        "Reef is stateless here and keeps no responses to continue from; send the whole conversation in input",
    ),
    "conversation": (
        lambda v: v is None,
        "server-held conversations are not supported; send the whole conversation in input",
    ),
    "background": (
        lambda v: v is None or v is False,
        "background responses are not supported; Reef answers in the request",
    ),
    "prompt": (lambda v: v is None, "stored prompt templates are not supported; send instructions and input"),
    "text": (
        _plain_text_config,
        "only the {'type': 'text'} format is supported; Reef does not constrain output "
        "to JSON (verbosity alone is ignored)",
    ),
    "top_logprobs": (lambda v: v is None or v == 0, "log-probabilities are not returned"),
    "moderation": (lambda v: v is None, "moderated responses are not supported"),
}
_TEXT_PARTS = ("input_text", "output_text")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
_DROPPED_ITEMS = ("reasoning",)  # earlier reasoning: not part of the visible conversation
_STATEFUL_ITEMS = ("item_reference",)
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}

_DEFAULT_ECHO: dict[str, Any] = {
    "instructions": None,
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "max_output_tokens": None,
    "temperature": None,
    "top_p": None,
}
ECHO: ContextVar[dict[str, Any]] = ContextVar("reef_responses_echo", default=_DEFAULT_ECHO)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _Body(_Wire):
    model: str = Field(min_length=1)
    input: Any = Field()
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool | None = None
    parallel_tool_calls: bool | None = None  # ignored, echoed back


class _MessageIn(_Wire):
    role: str
    content: Any


class _TextPart(_Wire):
    type: str
    text: str


class _RefusalPart(_Wire):
    type: str
    refusal: str


class _FunctionCallIn(_Wire):
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class _FunctionCallOutputIn(_Wire):
    call_id: str = Field(min_length=1)
    output: Any


class _NamespaceIn(_Wire):
    name: str = Field(min_length=1)
    tools: list[Any]


class _ToolIn(_Wire):
    type: str
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # accepted and ignored: Reef does not constrain decoding


_validate = validate_wire  # errors name the field path, as in the other dialects


def parse_responses_request(body: Any, unsupported_tools: UnsupportedTools = "drop") -> ChatRequest:
    """Validate a Responses API body into a `ChatRequest` (dialect "responses"); tools Reef
    cannot serve are left out or refused as `unsupported_tools` says (`reef/serve/tool_policy.py`)."""
    check_body(body, REFUSED)
    b: _Body = _validate(_Body, body, "")
    messages: list[Message] = []
    if b.instructions:
        messages.append(Message(role="system", content=b.instructions))
    if isinstance(b.input, str):
        messages.append(Message(role="user", content=b.input))
    elif isinstance(b.input, list):
        if not b.input:
            raise InvalidInput("input: must not be empty")
        for i, raw in enumerate(b.input):
            _item(raw, f"input[{i}]", messages)
    else:
        raise InvalidInput("input: must be a string or a list of input items")
    policy = ToolPolicy(unsupported_tools)
    tools, echoes, namespaces = _tools(b.tools or [], policy)
    tool_choice = parse_tool_choice(b.tool_choice, tools, nested=False)
    ECHO.set(
        {
            "instructions": b.instructions,
            "tools": echoes,
            "namespaces": namespaces,
            "tool_choice": "auto" if b.tool_choice is None else b.tool_choice,
            "parallel_tool_calls": True if b.parallel_tool_calls is None else b.parallel_tool_calls,
            "max_output_tokens": b.max_output_tokens,
            "temperature": b.temperature,
            "top_p": b.top_p,
        }
    )
    return ChatRequest(
        model=b.model,
        messages=tuple(messages),
        dialect="responses",
        tools=tools,
        tool_choice=tool_choice,
        max_tokens=b.max_output_tokens,
        temperature=b.temperature,
        top_p=b.top_p,
        stream=bool(b.stream),
        dropped_tools=tuple(policy.dropped),
    )


def _item_type(raw: dict[str, Any], path: str) -> str:
    kind = raw.get("type")
    if kind is None:  # an easy input message has no type; a bare {"id"} is an item reference
        kind = "message" if "role" in raw else ("item_reference" if "id" in raw else None)
    if not isinstance(kind, str):
        raise InvalidInput(f"{path}.type: Field required")
    return kind


def _item(raw: Any, path: str, out: list[Message]) -> None:
    """Append one input item to `out`. A function_call joins the assistant turn just before it
    (its text, or the calls before it), so parallel calls and their outputs keep the order a
    chat-completions runtime needs: one assistant turn with every call, then each output."""
    if not isinstance(raw, dict):
        raise InvalidInput(f"{path}: must be an object")
    kind = _item_type(raw, path)
    if kind == "message":
        m: _MessageIn = _validate(_MessageIn, raw, path)
        role = _ROLES.get(m.role)
        if role is None:
            raise InvalidInput(f"{path}.role: must be 'user', 'system', 'developer' or 'assistant', got {m.role!r}")
        out.append(Message(role=role, content=_text(m.content, f"{path}.content", assistant=role == "assistant")))
    elif kind == "function_call":
        c: _FunctionCallIn = _validate(_FunctionCallIn, raw, path)
        call = ToolCall(id=c.call_id, name=c.name, arguments=c.arguments)
        last = out[-1] if out else None
        if last is not None and last.role == "assistant":
            out[-1] = Message(
                role="assistant", content=last.content, tool_calls=(*last.tool_calls, call), name=last.name
            )
        else:
            out.append(Message(role="assistant", content="", tool_calls=(call,)))
    elif kind == "function_call_output":
        o: _FunctionCallOutputIn = _validate(_FunctionCallOutputIn, raw, path)
        out.append(Message(role="tool", content=_text(o.output, f"{path}.output"), tool_call_id=o.call_id))
    elif kind in _DROPPED_ITEMS:
        return
    elif kind in _STATEFUL_ITEMS:
        raise InvalidInput(
            f"{path}.type: {kind!r} items need server-held state; Reef is stateless here, send the item itself"
        )
    else:
        raise InvalidInput(
            f"{path}.type: {kind!r} items are not supported; Reef takes messages, "
            "function_call and function_call_output items"
        )


def _text(content: Any, path: str, *, assistant: bool = False) -> str:
    """A string, or text parts (`input_text`, `output_text`; an assistant's `refusal`) joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput(f"{path}: must be a string or a list of content parts")
    texts: list[str] = []
    for j, part in enumerate(content):
        where = f"{path}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            texts.append(_validate(_TextPart, part, where).text)
        elif kind == "refusal" and assistant:
            texts.append(_validate(_RefusalPart, part, where).refusal)
        elif kind in _MEDIA_PARTS:
            raise InvalidInput(f"{where}.type: {kind!r} parts are not supported; Reef serves text only")
        else:
            raise InvalidInput(f"{where}.type: expected an input_text or output_text part, got {kind!r}")
    return "\n".join(texts)


def _tools(raws: list[Any], policy: ToolPolicy) -> tuple[tuple[Tool, ...], list[dict[str, Any]], dict[str, str]]:
    """The function tools served, how the response echoes the request's tools, and the
    namespace of each function that came from a `namespace` tool (its calls name it again).
    A namespace's functions are served under their own names; other tools go to `policy`."""
    tools: dict[str, Tool] = {}
    echoes: list[dict[str, Any]] = []
    namespaces: dict[str, str] = {}
    for i, raw in enumerate(raws):
        path = f"tools[{i}]"
        if not isinstance(raw, dict):
            raise InvalidInput(f"{path}: must be an object")
        if raw.get("type") == "function":
            tool, echo = _tool(raw, path)
            tools.setdefault(tool.name, tool)
            echoes.append(echo)
        elif raw.get("type") == "namespace":
            namespace = _validate(_NamespaceIn, raw, path)
            for j, inner in enumerate(namespace.tools):
                where = f"{path}.tools[{j}]"
                if not (isinstance(inner, dict) and inner.get("type") == "function"):
                    policy.unsupported(inner.get("type") if isinstance(inner, dict) else None, where)
                    continue
                tool, _ = _tool(inner, where)
                if tool.name not in tools:  # a function tool of the same name keeps it
                    tools[tool.name] = tool
                    namespaces[tool.name] = namespace.name
            echoes.append(raw)
        else:
            policy.unsupported(raw.get("type"), path)
    return tuple(tools.values()), echoes, namespaces


def _tool(raw: dict[str, Any], path: str) -> tuple[Tool, dict[str, Any]]:
    """A function tool, and how the response echoes it."""
    t: _ToolIn = _validate(_ToolIn, raw, path)
    tool = (
        Tool(name=t.name, description=t.description)
        if t.parameters is None
        else Tool(name=t.name, description=t.description, parameters=t.parameters)
    )
    echo = {
        "type": "function",
        "name": t.name,
        "description": t.description,
        "parameters": t.parameters,
        "strict": t.strict,
    }
    return tool, echo
