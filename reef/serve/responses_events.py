"""The OpenAI Responses API's answers: `response_body` turns a `ChatResult` into the `response`
object, `EventEncoder` a stream of deltas into the semantic SSE events (`response.created` ...
`response.completed`, each with a `sequence_number`) the official `openai` SDK parses. The
request settings a `response` repeats back come from the context variable
`reef.serve.responses_wire` left them in (`ECHO`). No I/O here."""

from __future__ import annotations

import json
from typing import Any

from reef.core.chat import ChatResult, Delta, Finish, TextDelta, ToolCall, ToolCallDelta, Usage
from reef.serve.responses_wire import ECHO

# -- responses --------------------------------------------------------------------------------


def response_id(record_id: str) -> str:
    return f"resp_{record_id}"


def _message_id(record_id: str, output_index: int) -> str:
    return f"msg_{record_id}" if output_index == 0 else f"msg_{record_id}_{output_index}"


def _call_id(record_id: str, output_index: int) -> str:
    return f"fc_{record_id}_{output_index}"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call: ToolCall, status: str, arguments: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if arguments is None else arguments,
    }
    namespace = ECHO.get().get("namespaces", {}).get(call.name)
    if namespace is not None:  # a function of a `namespace` tool: its call names the namespace
        item["namespace"] = namespace
    return item


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _status(finish_reason: str) -> str:
    if finish_reason == "error":
        raise ValueError("a result that finished with 'error' has no response body")
    return "incomplete" if finish_reason == "length" else "completed"


def response_object(
    record_id: str,
    created_at: int,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    echo: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `response` object; the request's settings come from `echo`, else from the parse of
    this task's request."""
    echo = echo or ECHO.get()
    return {
        "id": response_id(record_id),
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": echo["instructions"],
        "max_output_tokens": echo["max_output_tokens"],
        "model": model,
        "output": output,
        "parallel_tool_calls": echo["parallel_tool_calls"],
        "previous_response_id": None,
        "temperature": echo["temperature"],
        "text": {"format": {"type": "text"}},
        "tool_choice": echo["tool_choice"],
        "tools": echo["tools"],
        "top_p": echo["top_p"],
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    }


def response_body(result: ChatResult, *, record_id: str, created_at: int, model: str) -> dict[str, Any]:
    """The non-streaming body: a message (when there is text, or nothing else), then one
    function_call item per call. A result that finished with "error" must be answered with an
    error status instead; handing one here is a bug (ValueError)."""
    status = _status(result.finish_reason)
    output: list[dict[str, Any]] = []
    if result.text or not result.tool_calls:
        output.append(_message_item(_message_id(record_id, 0), status, [_text_part(result.text)]))
    for call in result.tool_calls:
        output.append(_call_item(_call_id(record_id, len(output)), call, "completed"))
    return response_object(record_id, created_at, model, status, output, _usage(result.usage))


def event(kind: str, data: dict[str, Any]) -> bytes:
    """One SSE frame: `event: <kind>`, `data: {json}` and a blank line."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {payload}\n\n".encode()


class EventEncoder:
    """Turns deltas into Responses API stream events, already framed as SSE bytes (a
    `StreamEncoder`: `start()`, `delta(d)` for each delta, then `end(reef)` or `error(...)`).

    `response.created` and `response.in_progress` open; text opens a message item lazily
    (`output_item.added`, `content_part.added`) and streams `output_text.delta`s; each tool call
    closes any open message and is one whole function_call item (added, one arguments delta,
    arguments done, item done); the `Finish` closes any open message (`output_text.done`,
    `content_part.done`, `output_item.done`), and `end` sends `response.completed` (or
    `response.incomplete` after a length stop) with the whole response and Reef's receipt.
    A failure sends an `error` event and then `response.failed`. Every event carries the next
    `sequence_number`, from 0.
    """

    def __init__(self, record_id: str, created_at: int, model: str) -> None:
        self.record_id = record_id
        self.created_at = created_at
        self.model = model
        self._echo = ECHO.get()  # built in the request's task; the events go out from another
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # finished items, in output order
        self._text: list[str] | None = None  # the open message's text so far
        self._final: tuple[str, Usage] | None = None  # status and usage, once the Finish came
        self._failed = False

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        frame = event(kind, {"type": kind, **data, "sequence_number": self._seq})
        self._seq += 1
        return frame

    def _response(
        self, status: str, usage: dict[str, Any] | None = None, error: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return response_object(
            self.record_id, self.created_at, self.model, status, list(self._output), usage, error, self._echo
        )

    def start(self) -> bytes:
        snapshot = self._response("in_progress")
        return self._event("response.created", {"response": snapshot}) + self._event(
            "response.in_progress", {"response": snapshot}
        )

    def _open_message(self) -> bytes:
        self._text = []
        index = len(self._output)
        item_id = _message_id(self.record_id, index)
        return self._event(
            "response.output_item.added", {"output_index": index, "item": _message_item(item_id, "in_progress", [])}
        ) + self._event(
            "response.content_part.added",
            {"item_id": item_id, "output_index": index, "content_index": 0, "part": _text_part("")},
        )

    def _close_message(self, status: str = "completed") -> bytes:
        if self._text is None:
            return b""
        text, self._text = "".join(self._text), None
        index = len(self._output)
        item_id = _message_id(self.record_id, index)
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        part = _text_part(text)
        item = _message_item(item_id, status, [part])
        self._output.append(item)
        return (
            self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
            + self._event("response.content_part.done", {**where, "part": part})
            + self._event("response.output_item.done", {"output_index": index, "item": item})
        )

    def delta(self, delta: Delta) -> bytes:
        if isinstance(delta, TextDelta):
            if not delta.text:
                return b""
            out = self._open_message() if self._text is None else b""
            assert self._text is not None
            self._text.append(delta.text)
            index = len(self._output)
            return out + self._event(
                "response.output_text.delta",
                {
                    "item_id": _message_id(self.record_id, index),
                    "output_index": index,
                    "content_index": 0,
                    "delta": delta.text,
                    "logprobs": [],
                },
            )
        if isinstance(delta, ToolCallDelta):
            call = delta.call
            out = self._close_message()
            index = len(self._output)
            item_id = _call_id(self.record_id, index)
            where = {"item_id": item_id, "output_index": index}
            item = _call_item(item_id, call, "completed")
            self._output.append(item)
            return (
                out
                + self._event(
                    "response.output_item.added",
                    {"output_index": index, "item": _call_item(item_id, call, "in_progress", "")},
                )
                + self._event("response.function_call_arguments.delta", {**where, "delta": call.arguments})
                + self._event("response.function_call_arguments.done", {**where, "arguments": call.arguments})
                + self._event("response.output_item.done", {"output_index": index, "item": item})
            )
        if not isinstance(delta, Finish):
            raise TypeError(f"not a delta: {delta!r}")
        if delta.reason == "error":
            return self.error("server_error", "the model runtime failed while streaming")
        return self._finish(_status(delta.reason), delta.usage)

    def _finish(self, status: str, usage: Usage) -> bytes:
        out = b"" if self._output or self._text is not None else self._open_message()  # always some answer
        out += self._close_message("incomplete" if status == "incomplete" else "completed")
        self._final = (status, usage)
        return out

    def end(self, reef: dict[str, Any]) -> bytes:
        """`response.completed` (`response.incomplete` after a length stop), carrying Reef's
        receipt `{agent_record_id, release_id, verified}` on the event and on its response."""
        if self._failed:
            return b""
        out = self._finish("completed", Usage()) if self._final is None else b""  # a runtime that sent no Finish
        assert self._final is not None
        status, usage = self._final
        response = self._response(status, _usage(usage))
        response["reef"] = reef
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + self._event(kind, {"response": response, "reef": reef})

    def error(self, kind: str, message: str) -> bytes:
        """An `error` event, then `response.failed` with what was answered so far."""
        if self._failed:
            return b""
        self._failed = True
        out = self._close_message("incomplete")
        failed = self._response("failed", error={"code": "server_error", "message": message})
        return (
            out
            + self._event("error", {"code": kind, "message": message, "param": None})
            + self._event("response.failed", {"response": failed})
        )
