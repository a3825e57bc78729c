"""The routes every agent request takes, dispatched without FastAPI's routing.

`POST /v1/chat/completions`, `POST /v1/messages` and `POST /v1/responses` go straight from the
ASGI scope to `InferenceService.handle`. FastAPI's route matching, dependency solving and exception
middleware cost about a fifth of Reef's CPU per proxied request (py-spy, bench/proxy.py); this
layer sits inside the token and body-limit guards, so they still apply, and answers errors
exactly as the FastAPI handlers do. The same routes stay declared in `routes_v1` for the
OpenAPI schema and as the path every other method or spelling takes.
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from reef.core.errors import ReefError
from reef.serve.dialects import ANTHROPIC, OPENAI, RESPONSES, Dialect
from reef.serve.http_errors import error_response, reef_error_response
from reef.serve.inference import InferenceService

log = logging.getLogger("reef.serve")

HOT: dict[str, tuple[Dialect, str]] = {
    "/v1/chat/completions": (OPENAI, "chat_completions"),
    "/v1/messages": (ANTHROPIC, "messages"),
    "/v1/responses": (RESPONSES, "responses"),
}


class HotRoutes:
    def __init__(self, app: ASGIApp, service: InferenceService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = HOT.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if hot is None:
            await self.app(scope, receive, send)
            return
        dialect, route = hot
        request = Request(scope, receive)
        try:
            response = await self.service.handle(dialect, await request.body(), request.headers, route)
        except ClientDisconnect:  # the client left (or body_timeout closed it) before its body arrived
            return
        except ReefError as exc:
            response = reef_error_response(scope["path"], exc)
        except Exception as exc:  # noqa: BLE001 - the client gets its dialect's 500, the log the detail
            log.exception("unexpected error on %s", scope["path"])
            response = error_response(scope["path"], 500, f"internal error: {type(exc).__name__}")
        await response(scope, receive, send)
