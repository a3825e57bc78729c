"""Requests a web page could make the operator's browser send: refused before any route runs.

A browser adds no token of Reef's to a request by itself, so where tokens are configured a
forged request already fails at `TokenAuth`. Two guards cover the rest:

- `JsonBodies` (always): a POST body must be JSON (`application/json` or `application/*+json`),
  else 415. A page of another site may send a form or `text/plain` without asking the server,
  but JSON only after a CORS preflight, which Reef never grants.
- `LoopbackOnly` (only where no token is configured, the default on loopback): the Host must
  name this machine's loopback (`localhost`, `127.0.0.0/8`, `[::1]`, any port) or the
  configured `host` or `public_url`'s host, else 403: a DNS-rebinding page reaches 127.0.0.1
  under its own name. `insecure` (a token-less server on a network, where every machine may
  call it directly) turns the Host check off. And a request that fetch metadata says another
  site made (`Sec-Fetch-Site: cross-site` or `same-site`, a page on another port of
  localhost being same-site) or whose `Origin` is not the server's own is refused with 403;
  the dashboard's static files under `/ui` hold no data and may be opened from a link anywhere.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from reef.config import ServeConfig
from reef.core.urls import is_loopback
from reef.serve.http_errors import error_response
from reef.ui import PREFIX as DASHBOARD

_FOREIGN_SITES = frozenset({b"cross-site", b"same-site"})
_SHOWN = 100  # characters of a refused header value the error message repeats


class JsonBodies:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or is_json(_header(scope, b"content-type")):
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"content-type")
        message = (
            f"a POST body must be JSON: send 'Content-Type: application/json' "
            f"(got {_shown(given) if given is not None else 'none'})"
        )
        await error_response(scope["path"], 415, message, "invalid_request_error")(scope, receive, send)


def is_json(content_type: bytes | None) -> bool:
    """`application/json` or `application/<anything>+json`, any parameters, any case."""
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    kind, _, subtype = media.partition(b"/")
    return kind == b"application" and (subtype == b"json" or (subtype.endswith(b"+json") and len(subtype) > 5))


class LoopbackOnly:
    def __init__(self, app: ASGIApp, own_hosts: frozenset[str], check_host: bool = True) -> None:
        self.app = app
        self.own_hosts = own_hosts
        self.check_host = check_host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self._problem(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        message = (
            f"refused {problem}: this server has no token, so it answers only requests addressed "
            "to this machine's loopback from its own pages or from programs, not from other web sites; "
            "set a token (REEF_TOKEN) to serve other names or sites"
        )
        await error_response(scope["path"], 403, message, "permission_error")(scope, receive, send)

    def _problem(self, scope: Scope) -> str | None:
        host = _header(scope, b"host")
        if self.check_host and host is not None and not self._is_own(host_name(host)):
            return f"Host {_shown(host)}"
        if _opens_the_dashboard(scope):
            return None
        site = _header(scope, b"sec-fetch-site")
        if site is not None and site.strip().lower() in _FOREIGN_SITES:
            return f"a request another site made (Sec-Fetch-Site {_shown(site)})"
        origin = _header(scope, b"origin")
        if origin is not None and not _same_origin(origin, host):
            return f"a request from Origin {_shown(origin)}"
        return None

    def _is_own(self, name: str) -> bool:
        return name in self.own_hosts or is_loopback(name)


def own_hosts(config: ServeConfig) -> frozenset[str]:
    """The names besides loopback a token-less server answers to: its `host` and `public_url`'s."""
    names = {config.host.strip("[]").lower()}
    if config.public_url:
        names.add((urlsplit(config.public_url).hostname or "").lower())
    return frozenset(n for n in names if n and n not in ("0.0.0.0", "::"))


def host_name(host: bytes) -> str:
    """The name in a Host header, without port or IPv6 brackets, lower case ('' if malformed)."""
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):
        name, bracket, port = text[1:].partition("]")
        return name if bracket and (not port or (port[0] == ":" and port[1:].isdigit())) else ""
    name, colon, port = text.rpartition(":")
    return name if colon and port.isdigit() else text


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    """Whether `Origin` is this server's own: the scheme and the very Host the request came to."""
    if host is None:
        return False
    value, own = origin.strip().lower(), host.strip().lower()
    return value in (b"http://" + own, b"https://" + own)


def _opens_the_dashboard(scope: Scope) -> bool:
    path = scope["path"]
    return scope["method"] in ("GET", "HEAD") and (path == DASHBOARD or path.startswith(DASHBOARD + "/"))


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def _shown(value: bytes) -> str:
    text = value.decode("latin-1")
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")
