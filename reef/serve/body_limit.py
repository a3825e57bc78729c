"""Request bodies are size limited (HTTP 413) before anything reads them whole, and request
headers all together (HTTP 431): the HTTP server itself bounds neither. A route whose bodies are
larger by nature (an import of 1000 records) has its own, explicit limit and setting."""

from __future__ import annotations

from typing import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reef.core.errors import PayloadTooLarge
from reef.serve.http_errors import error_response


class BodyLimit:
    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        max_header_bytes: int = 64 * 1024,
        routes: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_header_bytes = max_header_bytes
        self.routes = dict(routes or {})  # path -> (its limit, the setting that sets it)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header_bytes = sum(len(name) + len(value) for name, value in scope["headers"])
        if header_bytes > self.max_header_bytes:
            message = (
                f"request headers are {header_bytes} bytes, larger than the limit of {self.max_header_bytes}"
                " (limits.max_header_bytes)"
            )
            await error_response(scope["path"], 431, message)(scope, receive, send)
            return
        max_bytes, setting = self.routes.get(scope["path"], (self.max_bytes, "max_body_bytes"))
        message = f"request body is larger than the limit of {max_bytes} bytes ({setting})"
        declared = _content_length(scope)
        if declared is not None and declared > max_bytes:
            await error_response(scope["path"], 413, message)(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            received = await receive()
            if received["type"] == "http.request":
                seen += len(received.get("body", b""))
                if seen > max_bytes:
                    raise PayloadTooLarge(message)
            return received

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
