"""What the wire tests share: a parser's error that names its field, a body with one field
changed, and an SSE answer for the SDKs' in-memory transports."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import httpx2
import pytest

from reef.core.chat import ChatRequest, ChatResult, Delta, Finish, TextDelta, ToolCall, ToolCallDelta, Usage
from reef.core.errors import InvalidInput

DOCS = Path(__file__).resolve().parent.parent.parent / "docs" / "wire.md"
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


RECEIPT = {"agent_record_id": "rec_1", "release_id": "rel_1", "verified": True}


def gathered(deltas: list[Delta]) -> ChatResult:
    result = ChatResult()
    for delta in deltas:
        result.add(delta)
    return result


CALL = ToolCall("call_9", "weather", OSLO)
DELTAS: list[Delta] = [
    TextDelta("Hel"),
    TextDelta(""),
    TextDelta("lo"),
    ToolCallDelta(CALL, 0),
    ToolCallDelta(ToolCall("call_10", "weather", "not json"), 1),
    Finish("tool_calls", Usage(11, 5)),
]
