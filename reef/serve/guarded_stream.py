"""A streaming response that cannot be held open by its client.

Starlette's `StreamingResponse` waits on every `send` for as long as the client takes, and
leaves closing the body generator to the garbage collector when the client goes away. A client
that stops reading (the socket's buffers full) would then hold the stream, its record, its
release pin and its provider connection for good. Here each send has a deadline
(`limits.stream_send_timeout`; a send found waiting that long, checked every half of it,
drops the stream), a disconnect cancels the stream at once, and the body generator is
always closed before the response returns, so its own clean-up (finishing the record) runs now.
"""

from __future__ import annotations

import logging
import time
from typing import AsyncGenerator, Mapping

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

log = logging.getLogger("reef.serve")


class GuardedStream(Response):
    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncGenerator[bytes, None], headers: Mapping[str, str], send_timeout: float) -> None:
        self.chunks = chunks
        self.send_timeout = send_timeout
        self.status_code = 200
        self.background = None
        self.abandoned: str | None = None  # why the stream ended early, for the record
        self._sending_since: float | None = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._pump, send, group.cancel_scope)
                group.start_soon(self._watch_sends, group.cancel_scope)
                await _disconnected(receive)
                self.abandoned = self.abandoned or "client disconnected before the end of the stream"
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.chunks.aclose()

    async def _pump(self, send: Send, scope: anyio.CancelScope) -> None:
        try:
            await self._send(
                send, {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for chunk in self.chunks:
                await self._send(send, {"type": "http.response.body", "body": chunk, "more_body": True})
            await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            self.abandoned = "client connection broke during the stream"
        scope.cancel()

    async def _send(self, send: Send, message: dict) -> None:
        self._sending_since = time.monotonic()  # one clock read a send; a deadline per send cost ~14 us
        await send(message)
        self._sending_since = None

    async def _watch_sends(self, scope: anyio.CancelScope) -> None:
        """Drop the stream once one send has waited `send_timeout` (checked every half of it)."""
        while True:
            await anyio.sleep(self.send_timeout / 2)
            since = self._sending_since
            if since is not None and time.monotonic() - since >= self.send_timeout:
                self.abandoned = f"client read nothing for {self.send_timeout:g} s (stream_send_timeout)"
                log.warning("stream abandoned: %s", self.abandoned)
                scope.cancel()
                return


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
