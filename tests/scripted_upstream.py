"""A real HTTP server that plays an OpenAI- and Anthropic-compatible provider from a script.

    with ScriptedUpstream() as upstream:
        upstream.script(text="hi", tool_calls=[{"name": "f", "arguments": {"x": 1}}])
        ... point a client at upstream.base_url (OpenAI, ends in /v1) or upstream.root_url ...
        upstream.requests[-1].body, upstream.requests[-1].headers

Routes: POST /v1/chat/completions, POST /v1/messages, POST /v1/messages/count_tokens,
GET /v1/models. Scripted answers are served FIFO across both dialects; with the queue empty it
answers "echo: <last user text>", or `answer_with(fn)`'s `fn(body)`, or, after `answer_by_system(...)`, a text chosen by what the
system prompt contains (a stand-in model that follows a rule only when the rule is there). Streams use each dialect's real SSE shape, text split into
word chunks. A raw ASGI app (no framework) on uvicorn, so the default path stays cheap: it is
also the fast local upstream for proxy benchmarks (`python -m tests.scripted_upstream --port N`,
which does not record requests).

Modes beyond a plain answer play faults: `hang`, `reset`, `malformed`, `stop_midstream`,
`stall_midstream`, `slow`; `huge` (an answer of `size` bytes of text, sent in pieces until the
client hangs up: `huge_sent` says how far it got), `huge_sse_line` (one `data:` line of `size`
bytes with no newline), `redirect` (`status` 3xx to `location`; a queued redirect also answers
count_tokens). `headers` go out with an error or redirect answer (e.g. `retry-after`). `hits`
lists (method, path) of every request, even one no route answers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import uvicorn

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
MODES = (
    "normal",
    "hang",
    "reset",
    "malformed",
    "stop_midstream",
    "slow",
    "stall_midstream",
    "huge",
    "huge_sse_line",
    "redirect",
)
HUGE_PIECE = 64 * 1024  # "huge" modes send their `size` bytes in pieces of this size
_WORDS = re.compile(r"\s*\S+\s*$|\s*\S+")
_OPENAI_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}
_ANTHROPIC_FINISH = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_SSE_HEAD = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_JSON_HEAD = [(b"content-type", b"application/json")]


@dataclass
class Step:
    """One scripted answer. `tool_calls`: [{"name", "arguments": dict or JSON text, "id"?}]."""

    text: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish: str | None = None  # stop | length | tool_calls (or a raw dialect value); None: by content
    status: int = 200
    error: str | None = None
    error_type: str | None = None
    mode: str = "normal"
    delay: float = 0.0  # before the response head; in "slow" mode also between stream chunks
    usage: tuple[int, int] | None = None  # (prompt, completion); None: estimated
    model: str | None = None  # None: echo the request's model
    size: int = 0  # "huge": bytes of answer text; "huge_sse_line": bytes of one data line without a newline
    location: str | None = None  # "redirect": the Location header (status: the 3xx to answer)
    headers: dict[str, str] = field(default_factory=dict)  # extra headers of an error or redirect answer


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any


def _chunks(text: str) -> list[str]:
    return _WORDS.findall(text) or ([text] if text else [])


def _user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or ()):
        if message.get("role") not in ("user", "tool"):
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        for part in reversed(content or ()):
            if part.get("type") == "text":
                return str(part.get("text", ""))
            if part.get("type") == "tool_result":
                inner = part.get("content")
                return inner if isinstance(inner, str) else json.dumps(inner)
    return ""


def _system_text(body: dict[str, Any]) -> str:
    """The system prompt of either dialect's body (OpenAI system messages, Anthropic `system`)."""
    parts: list[Any] = [body.get("system") or ""]
    parts += [m.get("content") or "" for m in body.get("messages") or () if m.get("role") in ("system", "developer")]
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        else:
            texts += [str(block.get("text", "")) for block in part if isinstance(block, dict)]
    return "\n".join(texts)


def _args_text(call: dict[str, Any]) -> str:
    arguments = call.get("arguments", {})
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _pieces(text: str, n: int = 3) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _sse(data: Any, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\ndata: {payload}\n\n" if event else f"data: {payload}\n\n").encode()


def openai_events(step: Step, text: str, model: str, usage: tuple[int, int], with_usage: bool) -> list[bytes]:
    head = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    out = [
        b": scripted upstream\n\n",
        _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}),
    ]
    out += [
        _sse({**head, "choices": [{"index": 0, "delta": {"content": c}, "finish_reason": None}]}) for c in _chunks(text)
    ]
    for i, call in enumerate(step.tool_calls):
        first = {
            "index": i,
            "id": call.get("id", f"call_{i}"),
            "type": "function",
            "function": {"name": call["name"], "arguments": ""},
        }
        out.append(_sse({**head, "choices": [{"index": 0, "delta": {"tool_calls": [first]}, "finish_reason": None}]}))
        out += [
            _sse(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"tool_calls": [{"index": i, "function": {"arguments": p}}]},
                            "finish_reason": None,
                        }
                    ],
                }
            )
            for p in _pieces(_args_text(call))
        ]
    finish = _finish(step, _OPENAI_FINISH)
    out.append(_sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    if with_usage:
        out.append(_sse({**head, "choices": [], "usage": _openai_usage(usage)}))
    out.append(b"data: [DONE]\n\n")
    return out


def anthropic_events(step: Step, text: str, model: str, usage: tuple[int, int]) -> list[bytes]:
    message = {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": 1},
    }
    out = [_sse({"type": "message_start", "message": message}, "message_start")]
    index = 0
    if text:
        out.append(
            _sse(
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                "content_block_start",
            )
        )
        out.append(_sse({"type": "ping"}, "ping"))
        out += [
            _sse(
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": c}},
                "content_block_delta",
            )
            for c in _chunks(text)
        ]
        out.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        index = 1
    for i, call in enumerate(step.tool_calls, start=index):
        block = {"type": "tool_use", "id": call.get("id", f"toolu_{i}"), "name": call["name"], "input": {}}
        out.append(_sse({"type": "content_block_start", "index": i, "content_block": block}, "content_block_start"))
        out += [
            _sse(
                {"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": p}},
                "content_block_delta",
            )
            for p in _pieces(_args_text(call))
        ]
        out.append(_sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
    out.append(
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": _finish(step, _ANTHROPIC_FINISH), "stop_sequence": None},
                "usage": {"output_tokens": usage[1]},
            },
            "message_delta",
        )
    )
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out


def openai_whole(step: Step, text: str, model: str, usage: tuple[int, int]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None}
    if step.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.get("id", f"call_{i}"),
                "type": "function",
                "function": {"name": c["name"], "arguments": _args_text(c)},
            }
            for i, c in enumerate(step.tool_calls)
        ]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(step, _OPENAI_FINISH)}],
        "usage": _openai_usage(usage),
    }


def anthropic_whole(step: Step, text: str, model: str, usage: tuple[int, int]) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [
        {"type": "tool_use", "id": c.get("id", f"toolu_{i}"), "name": c["name"], "input": json.loads(_args_text(c))}
        for i, c in enumerate(step.tool_calls)
    ]
    return {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _finish(step, _ANTHROPIC_FINISH),
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def huge_whole(anthropic: bool, model: str) -> tuple[bytes, bytes, bytes]:
    """(head, piece, tail) of a whole answer whose text is any number of pieces."""
    whole = (anthropic_whole if anthropic else openai_whole)(_DEFAULT, "@TEXT@", model, (1, 1))
    head, _, tail = json.dumps(whole).encode().partition(b"@TEXT@")
    return head, b"x" * HUGE_PIECE, tail


def huge_stream(anthropic: bool, model: str) -> tuple[bytes, bytes, bytes]:
    """(head, piece, tail) of a stream whose text is any number of events of one piece each."""
    text = "x" * HUGE_PIECE
    if anthropic:
        message = {
            "id": "msg_scripted",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        head = _sse({"type": "message_start", "message": message}, "message_start") + _sse(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            "content_block_start",
        )
        piece = _sse(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
            "content_block_delta",
        )
        tail = (
            _sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
            + _sse(
                {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
                "message_delta",
            )
            + _sse({"type": "message_stop"}, "message_stop")
        )
        return head, piece, tail
    chunk = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0, "model": model}
    head = _sse({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    piece = _sse({**chunk, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
    tail = _sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) + b"data: [DONE]\n\n"
    return head, piece, tail


def _finish(step: Step, table: dict[str, str]) -> str:
    finish = step.finish or ("tool_calls" if step.tool_calls else "stop")
    return table.get(finish, finish)


def _openai_usage(usage: tuple[int, int]) -> dict[str, int]:
    return {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": usage[0] + usage[1]}


class ScriptedApp:
    """The ASGI app. Thread-safe enough for tests: the deque and list are appended atomically."""

    def __init__(self, record: bool = True) -> None:
        self.record = record
        self.queue: collections.deque[Step] = collections.deque()
        self.requests: list[RecordedRequest] = []
        self.closing = False
        self.by_system: list[tuple[str, str]] = []  # (marker in the system prompt, answer)
        self.by_system_otherwise: str | None = None
        self.answer_fn: Callable[[dict[str, Any]], str] | None = None  # see ScriptedUpstream.answer_with
        self.hits: list[tuple[str, str]] = []
        self.huge_sent = 0  # bytes of the last "huge" answer sent before the client hung up (or all of them)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        path, method = scope["path"], scope["method"]
        if self.record:
            self.hits.append((method, path))
        if method == "GET" and path == "/v1/models":
            return await self._json(send, 200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"):
            return await self._json(
                send, 404, {"error": {"message": f"no route {method} {path}", "type": "not_found_error"}}
            )
        try:
            body = json.loads(raw)
        except ValueError:
            return await self._json(
                send, 400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}}
            )
        if self.record:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            self.requests.append(RecordedRequest(path, headers, body))
        if path.endswith("/count_tokens"):
            if self.queue and self.queue[0].mode == "redirect":  # a queued redirect answers count_tokens too
                return await self._redirect(send, self.queue.popleft())
            return await self._json(send, 200, {"input_tokens": len(raw) // 4})
        await self._answer(path == "/v1/messages", body, len(raw), receive, send)

    async def _answer(self, anthropic: bool, body: dict[str, Any], size: int, receive: Receive, send: Send) -> None:
        try:
            step = self.queue.popleft()
        except IndexError:
            step = None
        if step is None and self.answer_fn is not None:
            step, text = _DEFAULT, self.answer_fn(body)
        elif step is None and self.by_system_otherwise is not None:
            system = _system_text(body)
            step = _DEFAULT
            text = next((answer for marker, answer in self.by_system if marker in system), self.by_system_otherwise)
        elif step is None:  # the default echo: the benchmark path
            step, text = _DEFAULT, "echo: " + _user_text(body)
        else:
            text = step.text if step.text is not None else ("" if step.tool_calls else "echo: " + _user_text(body))
        if step.delay:
            await asyncio.sleep(step.delay)
        if step.mode == "hang":
            while not self.closing:
                await asyncio.sleep(0.05)
            return
        if step.mode == "reset":
            return await self._reset(receive, send)
        if step.mode == "redirect":
            return await self._redirect(send, step)
        if step.status >= 400:
            kind = step.error_type or _ERROR_TYPES.get(step.status, "api_error")
            message = step.error or f"scripted {step.status}"
            error = (
                {"type": "error", "error": {"type": kind, "message": message}}
                if anthropic
                else {"error": {"message": message, "type": kind, "param": None, "code": None}}
            )
            return await self._json(send, step.status, error, step.headers)
        model = step.model or str(body.get("model", "scripted"))
        if step.mode == "huge":
            return await self._huge(anthropic, bool(body.get("stream")), step, model, receive, send)
        if step.mode == "huge_sse_line":
            return await self._huge_sse_line(step, receive, send)
        usage = step.usage or (size // 4, len(_chunks(text)) + len(step.tool_calls))
        if not body.get("stream"):
            whole = (anthropic_whole if anthropic else openai_whole)(step, text, model, usage)
            data = json.dumps(whole).encode()
            if step.mode in ("stop_midstream", "stall_midstream"):  # promise the whole body, send half
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": _JSON_HEAD + [(b"content-length", str(len(data)).encode())],
                    }
                )
                await send({"type": "http.response.body", "body": data[: len(data) // 2], "more_body": True})
                if step.mode == "stall_midstream":
                    await self._stall()
                return  # stop_midstream: hang up
            return await self._raw(send, 200, _JSON_HEAD, data[: len(data) // 2] if step.mode == "malformed" else data)
        if anthropic:
            events = anthropic_events(step, text, model, usage)
        else:
            with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = openai_events(step, text, model, usage, with_usage)
        if step.mode == "malformed":
            events = events[:3] + [b'data: {"choices": [{"delta": \n\n']
        elif step.mode in ("stop_midstream", "stall_midstream"):
            events = events[:4]
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEAD})
        if step.mode == "slow":
            for event in events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
                await asyncio.sleep(step.delay)
            await send({"type": "http.response.body", "body": b""})
        elif step.mode == "stall_midstream":  # a few events, then silence with the connection open
            await send({"type": "http.response.body", "body": b"".join(events), "more_body": True})
            await self._stall()
        else:
            await send({"type": "http.response.body", "body": b"".join(events)})

    async def _redirect(self, send: Send, step: Step) -> None:
        headers = {**step.headers, **({"location": step.location} if step.location else {})}
        await self._json(send, step.status if 300 <= step.status < 400 else 307, {"moved": step.location}, headers)

    async def _huge(self, anthropic: bool, stream: bool, step: Step, model: str, receive: Receive, send: Send) -> None:
        """An answer of `step.size` bytes of text, sent piece by piece with no content-length,
        until the client hangs up (`huge_sent` says how far it got)."""
        head, piece, tail = (huge_stream if stream else huge_whole)(anthropic, model)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEAD if stream else _JSON_HEAD})
        await self._send_pieces(receive, send, head, piece, step.size // HUGE_PIECE, tail)

    async def _huge_sse_line(self, step: Step, receive: Receive, send: Send) -> None:
        """A stream whose second event is one `data:` line of `step.size` bytes with no newline."""
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEAD})
        await self._send_pieces(
            receive, send, b": scripted upstream\n\ndata: ", b"x" * HUGE_PIECE, step.size // HUGE_PIECE, b""
        )

    async def _send_pieces(
        self, receive: Receive, send: Send, head: bytes, piece: bytes, count: int, tail: bytes
    ) -> None:
        cycle = getattr(receive, "__self__", None)  # uvicorn's request cycle knows when the client has gone
        self.huge_sent = 0
        for data in (head, *([piece] * count), tail):
            if getattr(cycle, "disconnected", False):
                return
            await send({"type": "http.response.body", "body": data, "more_body": True})
            self.huge_sent += len(data)
            await asyncio.sleep(0)  # a send need not yield, and the loop must run to notice the hang-up
        await send({"type": "http.response.body", "body": b""})

    async def _stall(self) -> None:
        while not self.closing:
            await asyncio.sleep(0.05)

    async def _reset(self, receive: Receive, send: Send) -> None:
        """Abort the TCP connection with an RST (uvicorn's cycle exposes its transport); failing
        that, start a response and die, which makes uvicorn drop the connection."""
        transport = getattr(getattr(receive, "__self__", None), "transport", None)
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
            return
        await send({"type": "http.response.start", "status": 200, "headers": _JSON_HEAD})
        raise ConnectionResetError("scripted reset")

    async def _json(self, send: Send, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
        await self._raw(send, status, _JSON_HEAD + extra, json.dumps(body).encode())

    async def _raw(self, send: Send, status: int, headers: list[tuple[bytes, bytes]], data: bytes) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": headers + [(b"content-length", str(len(data)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": data})


_DEFAULT = Step()


class ScriptedUpstream:
    """Runs `ScriptedApp` under uvicorn in a background thread on 127.0.0.1 (a free port unless
    `port` is given). Use as a context manager."""

    def __init__(self, *, port: int = 0, record: bool = True) -> None:
        self.app = ScriptedApp(record=record)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self.port: int = self._sock.getsockname()[1]
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root_url}/v1"
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_level="critical",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.app.requests

    def script(
        self,
        text: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        finish: str | None = None,
        status: int = 200,
        error: str | None = None,
        mode: str = "normal",
        delay: float = 0.0,
        *,
        error_type: str | None = None,
        usage: tuple[int, int] | None = None,
        model: str | None = None,
        size: int = 0,
        location: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Queue one answer (FIFO, shared by both dialects)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.app.queue.append(
            Step(
                text,
                list(tool_calls or ()),
                finish,
                status,
                error,
                error_type,
                mode,
                delay,
                usage,
                model,
                size,
                location,
                dict(headers or {}),
            )
        )

    def answer_by_system(self, answers: dict[str, str], otherwise: str) -> None:
        """With no scripted answer queued, answer the first text of `answers` whose marker the
        system prompt contains, else `otherwise` (instead of the echo)."""
        self.app.by_system = list(answers.items())
        self.app.by_system_otherwise = otherwise

    def answer_with(self, answer: Callable[[dict[str, Any]], str] | None) -> None:
        """With no scripted answer queued, answer `answer(body)` (a stand-in model that reads the
        request: a judge, a simulated user); None goes back to the default."""
        self.app.answer_fn = answer

    def clear(self) -> None:
        """Forget queued answers and recorded requests."""
        self.app.queue.clear()
        self.app.requests.clear()
        self.app.hits.clear()

    def __enter__(self) -> ScriptedUpstream:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("scripted upstream did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.app.closing = True
        self._server.should_exit = True
        self._server.force_exit = True
        self._thread.join(timeout=5)
        self._sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="a fast scripted OpenAI/Anthropic upstream answering 'echo: <text>'")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8901)
    args = parser.parse_args()
    uvicorn.run(
        ScriptedApp(record=False),
        host=args.host,
        port=args.port,
        lifespan="off",
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )


if __name__ == "__main__":
    main()
