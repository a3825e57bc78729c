"""One face per wire dialect, so the request path never branches on which one it serves.

Each `Dialect` turns a body into a `ChatRequest`, a `ChatResult` into a response body, deltas
into SSE bytes, and errors into the dialect's own error shape; the wire details live in
`openai_wire.py`, `anthropic_wire.py`, `responses_wire.py` and `responses_events.py`.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from reef.core.chat import ChatRequest, ChatResult, Delta
from reef.serve import anthropic_wire, openai_wire, responses_events, responses_wire
from reef.serve.tool_policy import UnsupportedTools


class StreamEncoder(Protocol):
    def start(self) -> bytes: ...
    def delta(self, delta: Delta) -> bytes: ...
    def end(self, reef: dict[str, Any]) -> bytes: ...
    def error(self, kind: str, message: str) -> bytes: ...


class Dialect(Protocol):
    name: str
    counts_input_tokens: bool  # whether a stream's first event reports the prompt's token count
    receipt_in_body: bool  # whether a plain response body carries Reef's receipt under `reef`

    def parse(self, body: Any, unsupported_tools: UnsupportedTools = "drop") -> ChatRequest: ...
    def response(self, result: ChatResult, record_id: str, model: str) -> dict[str, Any]: ...
    def stream(self, body: Any, record_id: str, model: str, input_tokens: int) -> StreamEncoder: ...
    def error_body(self, kind: str, message: str) -> dict[str, Any]: ...


class OpenAIDialect:
    name = "openai"
    counts_input_tokens = False
    receipt_in_body = False

    def parse(self, body: Any, unsupported_tools: UnsupportedTools = "drop") -> ChatRequest:
        return openai_wire.parse_chat_request(body, unsupported_tools)

    def response(self, result: ChatResult, record_id: str, model: str) -> dict[str, Any]:
        return openai_wire.chat_completion(
            result, completion_id=f"chatcmpl-{record_id}", created=int(time.time()), model=model
        )

    def stream(self, body: Any, record_id: str, model: str, input_tokens: int) -> StreamEncoder:
        include_usage = isinstance(body, dict) and openai_wire.stream_include_usage(body)
        return _OpenAIStream(f"chatcmpl-{record_id}", int(time.time()), model, include_usage)

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        return openai_wire.error_body(message, kind)


class _OpenAIStream:
    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        self.encoder = openai_wire.ChunkEncoder(completion_id, created, model, include_usage)

    def start(self) -> bytes:
        return openai_wire.sse(self.encoder.first())

    def delta(self, delta: Delta) -> bytes:
        return b"".join(openai_wire.sse(chunk) for chunk in self.encoder.encode(delta))

    def end(self, reef: dict[str, Any]) -> bytes:
        chunk = self.encoder.reef_chunk(reef["agent_record_id"], reef["release_id"], reef["verified"])
        return openai_wire.sse(chunk) + openai_wire.DONE

    def error(self, kind: str, message: str) -> bytes:
        return openai_wire.sse(openai_wire.error_body(message, kind)) + openai_wire.DONE


class AnthropicDialect:
    name = "anthropic"
    counts_input_tokens = True
    receipt_in_body = False

    def parse(self, body: Any, unsupported_tools: UnsupportedTools = "drop") -> ChatRequest:
        return anthropic_wire.parse_messages_request(body)  # server tools stay refused here

    def response(self, result: ChatResult, record_id: str, model: str) -> dict[str, Any]:
        return anthropic_wire.message_response(result, message_id=f"msg_{record_id}", model=model)

    def stream(self, body: Any, record_id: str, model: str, input_tokens: int) -> StreamEncoder:
        return _AnthropicStream(anthropic_wire.EventEncoder(f"msg_{record_id}", model, input_tokens))

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        return anthropic_wire.error_body(kind, message)


class _AnthropicStream:
    def __init__(self, encoder: anthropic_wire.EventEncoder) -> None:
        self.encoder = encoder

    def start(self) -> bytes:
        return b"".join(self.encoder.start())

    def delta(self, delta: Delta) -> bytes:
        return b"".join(self.encoder.encode(delta))

    def end(self, reef: dict[str, Any]) -> bytes:
        return self.encoder.stop(reef)

    def error(self, kind: str, message: str) -> bytes:
        data = json.dumps(anthropic_wire.error_body(kind, message))
        return f"event: error\ndata: {data}\n\n".encode()


class ResponsesDialect:
    """OpenAI's Responses API (`/v1/responses`); errors in OpenAI's shape."""

    name = "responses"
    counts_input_tokens = False
    receipt_in_body = True

    def parse(self, body: Any, unsupported_tools: UnsupportedTools = "drop") -> ChatRequest:
        return responses_wire.parse_responses_request(body, unsupported_tools)

    def response(self, result: ChatResult, record_id: str, model: str) -> dict[str, Any]:
        return responses_events.response_body(result, record_id=record_id, created_at=int(time.time()), model=model)

    def stream(self, body: Any, record_id: str, model: str, input_tokens: int) -> StreamEncoder:
        return responses_events.EventEncoder(record_id, int(time.time()), model)

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        return openai_wire.error_body(message, kind)


OPENAI = OpenAIDialect()
ANTHROPIC = AnthropicDialect()
RESPONSES = ResponsesDialect()
