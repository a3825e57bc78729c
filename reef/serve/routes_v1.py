"""The `/v1/*` routes: OpenAI chat completions and responses, Anthropic messages, models, token counts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from reef.serve import anthropic_wire
from reef.serve.dialects import ANTHROPIC, OPENAI, RESPONSES
from reef.serve.inference import parse_json
from reef.serve.openapi_bodies import (
    ANTHROPIC_COUNT_TOKENS,
    ANTHROPIC_MESSAGES,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    json_body,
)


def build_router() -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def models(request: Request) -> dict[str, Any]:
        names = request.app.state.reef.runtime.served_models()
        # one list that both SDKs accept: OpenAI's fields and Anthropic's side by side
        data = [
            {
                "id": n,
                "object": "model",
                "created": 0,
                "owned_by": "reef",
                "type": "model",
                "display_name": n,
                "created_at": "1970-01-01T00:00:00Z",
            }
            for n in names
        ]
        return {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": names[0] if names else None,
            "last_id": names[-1] if names else None,
        }

    @router.post("/chat/completions", openapi_extra=json_body(OPENAI_CHAT, "OpenAI Chat Completions (docs/wire.md)"))
    async def chat_completions(request: Request) -> Response:
        service = request.app.state.reef.inference
        return await service.handle(OPENAI, await request.body(), request.headers, "chat_completions")

    @router.post("/responses", openapi_extra=json_body(OPENAI_RESPONSES, "OpenAI Responses, stateless (docs/wire.md)"))
    async def responses(request: Request) -> Response:
        service = request.app.state.reef.inference
        return await service.handle(RESPONSES, await request.body(), request.headers, "responses")

    @router.post("/messages", openapi_extra=json_body(ANTHROPIC_MESSAGES, "Anthropic Messages (docs/wire.md)"))
    async def messages(request: Request) -> Response:
        service = request.app.state.reef.inference
        return await service.handle(ANTHROPIC, await request.body(), request.headers, "messages")

    @router.post(
        "/messages/count_tokens",
        openapi_extra=json_body(ANTHROPIC_COUNT_TOKENS, "Anthropic Messages, max_tokens optional"),
    )
    async def count_tokens(request: Request) -> dict[str, int]:
        chat = anthropic_wire.parse_count_tokens_request(parse_json(await request.body()))
        reef = request.app.state.reef  # count what the runtime would get: the harness too, in inject mode
        chat = await reef.scenarios.harness.inject_current(reef.state, request.headers.get("x-reef-scenario"), chat)
        return {"input_tokens": await reef.runtime.count_tokens(chat)}

    return router
