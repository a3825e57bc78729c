"""The dashboard at `/ui`: static files (HTML, CSS, vanilla JavaScript) shipped in the package.

`Dashboard` is ASGI middleware that sits outside the token check: the files hold no data, so
the login page can load without a token; every data call the page makes goes to the `/reef/*`
routes with `Authorization: Bearer` and is checked there (its first, `GET /reef/status` without
a token, tells it whether the server needs one: a server without tokens opens with no sign-in).
The page is app.js (routing, polling, sign-in, scenarios, the chain, rollback and promote) and
one file per view it adds: curve.js, candidates.js, records.js, release.js. The page keeps the token in the
browser's sessionStorage, never in a URL (so never in an access log). Nothing is fetched from
anywhere else (a Content-Security-Policy of 'self' says so to the browser): it works offline.
"""

from __future__ import annotations

from importlib import resources

from starlette.types import ASGIApp, Receive, Scope, Send

PREFIX = "/ui"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_HEADERS = [
    (b"cache-control", b"no-cache"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        b"form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
    ),
]


def static_files() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content type) of every file in reef/ui/static."""
    found: dict[str, tuple[bytes, str]] = {}
    for entry in resources.files(__name__).joinpath("static").iterdir():
        suffix = entry.name[entry.name.rfind(".") :] if "." in entry.name else ""
        if entry.is_file() and suffix in _TYPES:
            found[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return found


class Dashboard:
    """Answers GET and HEAD under `/ui` from the files read at start; passes anything else on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.files = static_files()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != PREFIX and not path.startswith(PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _answer(send, 405, b"method not allowed\n", "text/plain; charset=utf-8", [(b"allow", b"GET, HEAD")])
            return
        if path == PREFIX:  # relative, so a proxy's path prefix survives
            await _answer(send, 308, b"", "text/plain; charset=utf-8", [(b"location", b"ui/")])
            return
        name = path[len(PREFIX) + 1 :] or "index.html"
        found = self.files.get(name)
        if found is None:
            await _answer(send, 404, b"not found\n", "text/plain; charset=utf-8")
            return
        body, content_type = found
        await _answer(send, 200, body if scope["method"] == "GET" else b"", content_type, length=len(body))


async def _answer(
    send: Send,
    status: int,
    body: bytes,
    content_type: str,
    extra: list[tuple[bytes, bytes]] | None = None,
    length: int | None = None,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body) if length is None else length).encode()),
        *_HEADERS,
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
