"""Request bodies are size limited (HTTP 413) before anything reads them whole, and request
headers all together (HTTP 431): the HTTP server itself bounds neither."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reef.core.errors import PayloadTooLarge
from reef.serve.http_errors import error_response


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, max_header_bytes: int = 64 * 1024) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_header_bytes = max_header_bytes

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
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await error_response(scope["path"], 413, self._message())(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise PayloadTooLarge(self._message())
            return message

        await self.app(scope, limited_receive, send)

    def _message(self) -> str:
        return f"request body is larger than the limit of {self.max_bytes} bytes (max_body_bytes)"


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
