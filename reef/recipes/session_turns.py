"""The turns of one conversation, recognised from recorded traffic alone.

A request whose messages start with an earlier request's messages plus that request's answer is
the next turn of the same conversation; what follows the answer (up to the next assistant
message) is that turn's *next state*. Messages are compared as the client sent them (the
harness Reef injected taken out), text trimmed, tool calls by name and arguments (ids differ
between a runtime's answer and a client's echo of it), through running sha256 hashes: one pass
over a request finds every earlier turn it could extend.
"""

from __future__ import annotations

import hashlib
import json
from typing import Sequence

from reef.core.types import JSON, Record
from reef.surfaces.inject import client_request


def client_messages(record: Record) -> list[JSON]:
    """The client's own messages (the harness Reef injected taken out)."""
    return list(client_request(record.request or {}, record.harness).get("messages") or [])


def _canon(message: JSON) -> bytes:
    """A message as the same client text in either dialect: role, trimmed text, tool calls by
    name and arguments (ids differ between a runtime's answer and a client's echo of it)."""
    calls = []
    for call in message.get("tool_calls") or ():
        arguments = call.get("arguments")
        try:
            arguments = json.dumps(json.loads(arguments) if isinstance(arguments, str) else arguments, sort_keys=True)
        except (TypeError, ValueError):
            pass
        calls.append([call.get("name"), arguments])
    content = message.get("content")
    text = content.strip() if isinstance(content, str) else json.dumps(content, sort_keys=True)
    return json.dumps([message.get("role"), text, calls], ensure_ascii=False).encode() + b"\x1e"


def prefix_digests(messages: Sequence[JSON]) -> list[tuple[int, str]]:
    """(index, hash of messages[:index + 1]) for every assistant message: one pass."""
    running = hashlib.sha256()
    out = []
    for index, message in enumerate(messages):
        running.update(_canon(message))
        if message.get("role") == "assistant":
            out.append((index, running.copy().hexdigest()))
    return out


def turn_key(messages: Sequence[JSON], response: JSON) -> str:
    """The hash a next turn's messages start with: this turn's messages plus its answer."""
    running = hashlib.sha256()
    for message in messages:
        running.update(_canon(message))
    running.update(
        _canon(
            {"role": "assistant", "content": response.get("text") or "", "tool_calls": response.get("tool_calls") or []}
        )
    )
    return running.hexdigest()


def until_assistant(messages: Sequence[JSON]) -> tuple[JSON, ...]:
    """What came right after an answer: the messages up to the next assistant message."""
    out = []
    for message in messages:
        if message.get("role") == "assistant":
            break
        out.append(message)
    return tuple(out)


# -- the judge ----------------------------------------------------------------------------------
