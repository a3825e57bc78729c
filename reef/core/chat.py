"""Reef's internal chat request and the stream a runtime answers it with.

Each wire dialect (OpenAI chat completions, Anthropic messages, OpenAI responses) converts into
`ChatRequest` exactly once and back from `Delta`s exactly once (`reef/serve/openai_wire.py`,
`reef/serve/anthropic_wire.py`, `reef/serve/responses_wire.py`); runtimes see only these types. So an Anthropic client can
talk to an OpenAI-only runtime and the reverse, and the request path never branches on dialect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Union

Dialect = Literal["openai", "anthropic", "responses"]  # "responses": OpenAI's Responses API
FinishReason = Literal["stop", "length", "tool_calls", "error"]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI carries it; Anthropic's `input` object is dumped to it


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True)
class Message:
    """One turn. `role` is system, user, assistant or tool; a tool turn answers `tool_call_id`."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class ChatRequest:
    model: str  # the name the client asked for (kept on the record)
    messages: tuple[Message, ...]
    dialect: Dialect
    tools: tuple[Tool, ...] = ()
    tool_choice: Any = None  # "auto" | "none" | "required" | {"name": ...}
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    seed: int | None = None
    dropped_tools: tuple[str, ...] = ()  # client tools Reef cannot serve, left out (`unsupported_tools: drop`)

    def to_json(self) -> dict[str, Any]:
        """The request as recorded: plain JSON, in Reef's own shape."""
        data: dict[str, Any] = {
            "model": self.model,
            "dialect": self.dialect,
            "messages": [_message_json(m) for m in self.messages],
            "tools": [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in self.tools],
            "tool_choice": self.tool_choice,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": list(self.stop),
            "stream": self.stream,
            "seed": self.seed,
        }
        if self.dropped_tools:  # absent unless some were: records without any keep their hash
            data["dropped_tools"] = list(self.dropped_tools)
        return data


def _message_json(m: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        data["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    if m.tool_call_id:
        data["tool_call_id"] = m.tool_call_id
    if m.name:
        data["name"] = m.name
    return data


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


# -- what a runtime yields, in order: any number of TextDelta / ToolCallDelta, then one Finish --


@dataclass(frozen=True)
class TextDelta:
    text: str
    token_ids: tuple[int, ...] = ()  # empty where the runtime does not give token ids
    logprobs: tuple[float, ...] = ()
    runtime_load_id: str | None = None  # the load that produced these tokens


@dataclass(frozen=True)
class ToolCallDelta:
    """A whole tool call (runtimes parse calls before emitting them)."""

    call: ToolCall
    index: int = 0


@dataclass(frozen=True)
class Finish:
    reason: FinishReason
    usage: Usage = field(default_factory=Usage)
    model: str | None = None  # the model that answered, as the runtime names it
    prompt_token_ids: tuple[int, ...] = ()  # the exact prompt the tokens continued (for training)


Delta = Union[TextDelta, ToolCallDelta, Finish]


@dataclass
class ChatResult:
    """A whole answer, gathered from the deltas (for non-streaming responses and the record)."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_loads: list[str | None] = field(default_factory=list)  # runtime_load_id per token
    model: str | None = None
    prompt_token_ids: list[int] = field(default_factory=list)

    def add(self, delta: Delta) -> None:
        if isinstance(delta, TextDelta):
            self.text += delta.text
            self.token_ids.extend(delta.token_ids)
            self.logprobs.extend(delta.logprobs)
            self.token_loads.extend([delta.runtime_load_id] * len(delta.token_ids))
        elif isinstance(delta, ToolCallDelta):
            self.tool_calls.append(delta.call)
        else:
            self.finish_reason = delta.reason
            self.usage = delta.usage
            self.model = delta.model
            self.prompt_token_ids = list(delta.prompt_token_ids)

    def response_json(self) -> dict[str, Any]:
        """The response as recorded (with the prompt's token ids when the runtime gave them)."""
        data = {
            "text": self.text,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls],
            "finish_reason": self.finish_reason,
            "usage": {"prompt_tokens": self.usage.prompt_tokens, "completion_tokens": self.usage.completion_tokens},
            "model": self.model,
        }
        if self.prompt_token_ids:
            data["prompt_token_ids"] = self.prompt_token_ids
        return data
