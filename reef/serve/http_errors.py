"""Errors on the wire: each route answers in its client's own dialect (invariant 10).

`/v1/messages*` answers Anthropic's shape, the other `/v1/*` routes OpenAI's, `/reef/*` and
the rest Reef's own `{"error": {"type", "message"}}`. Status codes: docs/http.md.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from reef.core.errors import (
    Conflict,
    Corruption,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ReefError,
    RuntimeFailure,
    StorageUnavailable,
    Unauthorized,
)
from reef.serve import anthropic_wire, openai_wire

_STATUS: list[tuple[type[ReefError], int]] = [
    (InvalidInput, 400),
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (PayloadTooLarge, 413),
    (StorageUnavailable, 503),
    (Corruption, 500),
]

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    502: "upstream_error",
    503: "service_unavailable",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    431: "invalid_request_error",
    502: "api_error",
    503: "overloaded_error",
}


def status_of(exc: ReefError) -> int:
    if isinstance(exc, RuntimeFailure):
        return exc.status
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_response(
    path: str, status: int, message: str, kind: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    if path.startswith("/v1/messages"):
        body = anthropic_wire.error_body(kind or _ANTHROPIC_TYPES.get(status, "api_error"), message)
    elif path.startswith("/v1/"):
        body = openai_wire.error_body(message, kind or _OPENAI_TYPES.get(status, "server_error"))
    else:
        body = {"error": {"type": kind or _OPENAI_TYPES.get(status, "server_error"), "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def reef_error_response(path: str, exc: ReefError) -> JSONResponse:
    status = status_of(exc)
    kind = exc.error_type if isinstance(exc, RuntimeFailure) and status < 500 else None
    return error_response(path, status, str(exc), kind, exc.headers or None)


async def reef_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ReefError)
    return reef_error_response(request.url.path, exc)
