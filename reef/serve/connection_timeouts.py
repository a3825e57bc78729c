"""uvicorn's HTTP/1.1 protocol (httptools) with deadlines on a client that is sending a request.

uvicorn closes a connection left idle after a response (`timeout_keep_alive`), but nothing
else: a connection that never sends a byte, one that sends half a request head and stalls, or
one that trickles a head or a body a byte at a time, each holds a socket (and for a body an
ASGI task) for as long as the client likes. This subclass adds two deadlines:

- the head: from the connection's start, or from the end of the previous answer, the next
  request head must be complete within `header_timeout` seconds. Data does not extend it, so
  a trickle cannot. A client that had started a head gets a 408; an idle one is just closed.
- the body: it may fall silent for at most `body_timeout` seconds (not counted while Reef
  itself has paused reading because the app is not taking the body yet). The request's task
  then sees the client disconnect.

It also bounds the request head's size (`limits.max_header_bytes`, 431): httptools itself
accepts any number of headers of any size, and an ASGI-level check would run only once the
whole head is in memory.

`timed_protocol(header_timeout, body_timeout, max_header_bytes)` makes the class for
`uvicorn.run(http=...)`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger("reef.serve")


class _HeadTooLarge(Exception):
    pass


class TimedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 64 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_started = False
        self._body_watch: asyncio.TimerHandle | None = None
        self._body_progress_at = 0.0
        self._head_bytes = 0
        self._head_too_large = False

    # -- the head ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # idle now: no pipelined request was waiting
            self._await_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_started = True
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_header_bytes:
            self._head_too_large = True
            raise _HeadTooLarge  # httptools stops parsing; uvicorn then calls send_400_response

    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            super().send_400_response(msg)
            return
        body = (
            f"request headers are larger than the limit of {self.max_header_bytes} bytes (limits.max_header_bytes)"
        ).encode("ascii")
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
            b"charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._cancel_head_deadline()
        self._head_started = False
        super().on_headers_complete()
        self._body_progress_at = self.loop.time()
        self._body_watch = self.loop.call_later(self.body_timeout, self._check_body)

    def _await_head(self) -> None:
        self._cancel_head_deadline()
        self._head_deadline = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        if self._head_started:
            logger.debug("closing a connection whose request head took over %ss", self.header_timeout)
            self._send_408(f"the request head did not arrive within {self.header_timeout:g} s (header_timeout)")
        self.transport.close()

    def _send_408(self, message: str) -> None:
        body = message.encode("ascii")
        self.transport.write(
            b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )

    # -- the body ---------------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        self._body_progress_at = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel_body_watch()
        super().on_message_complete()

    def _check_body(self) -> None:
        self._body_watch = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # paused by us, not the client: its silence starts when we resume
            self._body_progress_at = self.loop.time()
        silent = self.loop.time() - self._body_progress_at
        if silent < self.body_timeout:
            self._body_watch = self.loop.call_later(self.body_timeout - silent, self._check_body)
            return
        logger.debug("closing a connection whose request body stalled for over %ss", self.body_timeout)
        self.transport.close()

    def _cancel_body_watch(self) -> None:
        if self._body_watch is not None:
            self._body_watch.cancel()
            self._body_watch = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        self._cancel_body_watch()
        super().connection_lost(exc)


def timed_protocol(
    header_timeout: float, body_timeout: float, max_header_bytes: int = 64 * 1024
) -> type[TimedHttpToolsProtocol]:
    return type(
        "TimedHttpToolsProtocol",
        (TimedHttpToolsProtocol,),
        {"header_timeout": header_timeout, "body_timeout": body_timeout, "max_header_bytes": max_header_bytes},
    )
