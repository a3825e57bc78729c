"""Bearer-token authentication as plain ASGI middleware.

Every route but `/healthz` (and the dashboard's static files under `/ui`, which hold no data)
needs a token when any is configured: `Authorization: Bearer T`
(OpenAI clients) or `x-api-key: T` (Anthropic clients). Several tokens may be valid at once,
for rotation. Tokens are compared in constant time against every configured token, and never
logged or echoed.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from reef.serve.http_errors import error_response

OPEN_PATHS = frozenset({"/healthz"})


class TokenAuth:
    def __init__(self, app: ASGIApp, tokens: list[str]) -> None:
        self.app = app
        self.tokens = [t.encode() for t in tokens]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tokens or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        presented = _presented_token(scope)
        if presented is None or not self._accepts(presented):
            reason = "missing token" if presented is None else "invalid token"
            response = error_response(
                scope["path"], 401, f"{reason}: send 'Authorization: Bearer <token>' or 'x-api-key'"
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _accepts(self, presented: bytes) -> bool:
        ok = False
        for token in self.tokens:
            ok |= hmac.compare_digest(presented, token)
        return ok


def _presented_token(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].strip()
        if name == b"x-api-key":
            return value.strip()
    return None
