"""Security checks: every route but `/healthz` refuses a missing or wrong token (the routes are
read from the app's own OpenAPI schema, so a new route is covered the day it is added); the
token never reaches logs or records; the body size limit holds with and without a
content-length; scenario names and ids that try path traversal are refused and create
nothing on disk."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from reef.serve.hot_routes import HOT
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "sec-token-5d8e0b17c3"
UPSTREAM_KEY = "sk-upstream-never-logged-42"
LIMIT = 16 * 1024
OPEN_ROUTES = {("GET", "/healthz")}
USER = [{"role": "user", "content": "hello"}]
TRAVERSALS = [
    "../escape",
    "..%2fescape",
    "%2e%2e%2fescape",
    "%2e%2e",
    "..",
    "/etc/passwd",
    "%2fetc%2fpasswd",
    "a%00b",
    "a/../../b",
    "..\\escape",
    "C:\\windows",
]


@pytest.fixture(scope="module")
def reef(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings = {
        "tokens": [TOKEN],
        "max_body_bytes": LIMIT,
        "log_level": "debug",
        "recipes": {"default": "skills"},
        "upstream": {"url": upstream.base_url, "model": "provider-model", "api_key": UPSTREAM_KEY, "timeout": 5},
    }
    with ReefServer(tmp_path_factory.mktemp("reef-sec"), settings) as server:
        yield server


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def app_routes(reef: ReefServer) -> list[tuple[str, str]]:
    schema = httpx.get(f"{reef.url}/openapi.json", headers=auth()).json()
    routes = [(method.upper(), path) for path, item in schema["paths"].items() for method in item]
    hot = [("POST", path) for path in HOT]  # dispatched before FastAPI's routing: guard them by name too
    return routes + hot + [("GET", "/openapi.json")]


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "some-id", path)


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.name.startswith("reef-")}


def raw_request(
    reef: ReefServer, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """http.client sends the path byte for byte (httpx would normalise `..` segments away)."""
    conn = http.client.HTTPConnection("127.0.0.1", reef.port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={**auth(), "content-type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def test_every_route_but_healthz_refuses_a_missing_or_wrong_token(reef: ReefServer) -> None:
    routes = app_routes(reef)
    assert {("POST", "/v1/chat/completions"), ("POST", "/reef/report"), ("GET", "/metrics")} <= set(routes)
    wrong = [
        {},
        auth("wrong"),
        {"authorization": "Bearer"},
        {"x-api-key": "wrong"},
        {"authorization": TOKEN},
        {"authorization": f"Basic {TOKEN}"},
        auth(TOKEN + "x"),
        auth(TOKEN[:-1]),
    ]
    for method, path in routes:
        if (method, path) in OPEN_ROUTES:
            continue
        for headers in wrong:
            response = httpx.request(method, f"{reef.url}{concrete(path)}", headers=headers, json={})
            assert response.status_code == 401, f"{method} {path} with {headers} answered {response.status_code}"
            assert TOKEN not in response.text
    assert httpx.get(f"{reef.url}/healthz").status_code == 200


def test_the_token_is_accepted_in_both_headers(reef: ReefServer) -> None:
    assert httpx.get(f"{reef.url}/v1/models", headers={"x-api-key": TOKEN}).status_code == 200
    assert httpx.get(f"{reef.url}/v1/models", headers=auth()).status_code == 200


def test_the_token_never_reaches_logs_or_records(reef: ReefServer) -> None:
    body = {"model": "m", "messages": USER}
    headers = {**auth(), "x-reef-tag-source": "security", "x-api-key": TOKEN}
    plain = httpx.post(f"{reef.base_url}/chat/completions", json=body, headers=headers)
    streamed = httpx.post(f"{reef.base_url}/chat/completions", json={**body, "stream": True}, headers=headers)
    refused = httpx.post(f"{reef.base_url}/chat/completions", json=body, headers=auth(TOKEN + "-typo"))
    assert plain.status_code == streamed.status_code == 200 and refused.status_code == 401
    for response in (plain, streamed):
        record = httpx.get(f"{reef.url}/reef/records/{response.headers['x-reef-agent-record-id']}", headers=auth())
        assert record.status_code == 200
        assert TOKEN not in record.text and UPSTREAM_KEY not in record.text
    logs = reef.logs()
    assert "Application startup complete" in logs, "the server's log should be captured"
    assert TOKEN not in logs and UPSTREAM_KEY not in logs
    state = reef.state_dir
    for path in state.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert TOKEN.encode() not in data and UPSTREAM_KEY.encode() not in data, path


def test_the_body_limit_holds_with_and_without_content_length(reef: ReefServer) -> None:
    before = httpx.get(f"{reef.url}/reef/status", headers=auth()).json()["storage"]
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (LIMIT * 2)}]}).encode()

    def chunked() -> Iterator[bytes]:
        for i in range(0, len(big), 4096):
            yield big[i : i + 4096]

    for path in (
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/reef/report",
        "/reef/scenarios",
    ):
        sized = httpx.post(f"{reef.url}{path}", content=big, headers={**auth(), "content-type": "application/json"})
        assert sized.status_code == 413, f"{path} with content-length: {sized.status_code}"
        streamed = httpx.post(
            f"{reef.url}{path}", content=chunked(), headers={**auth(), "content-type": "application/json"}
        )
        assert streamed.request.headers.get("transfer-encoding") == "chunked"
        assert streamed.status_code == 413, f"{path} chunked: {streamed.status_code}"
    lying = raw_request(
        reef, "POST", "/v1/chat/completions", headers={"content-length": "10"}, body={"model": "m", "messages": USER}
    )
    assert lying[0] in (400, 413)  # uvicorn reads 10 bytes: not JSON
    assert httpx.get(f"{reef.url}/reef/status", headers=auth()).json()["storage"] == before


def test_path_traversal_in_scenario_names_and_ids_is_refused(reef: ReefServer, tmp_path: Path) -> None:
    created = httpx.post(f"{reef.url}/reef/scenarios", json={"name": "safe"}, headers=auth())
    assert created.status_code == 201
    head = created.json()["head"]["release_id"]
    root = reef.workdir
    before = files_under(root)
    names_before = [s["name"] for s in httpx.get(f"{reef.url}/reef/scenarios", headers=auth()).json()["scenarios"]]
    statuses: list[tuple[str, int]] = []
    for bad in TRAVERSALS:
        for method, path, body in [
            ("GET", f"/reef/scenarios/{bad}", None),
            ("GET", f"/reef/scenarios/{bad}/releases", None),
            ("GET", f"/reef/scenarios/{bad}/decisions", None),
            ("POST", f"/reef/scenarios/{bad}/rollback", {"release_id": head}),
            ("POST", "/reef/scenarios/safe/rollback", {"release_id": bad}),
            ("POST", "/reef/scenarios/safe/rollback", {"release_id": head, "expected_head": bad}),
            ("GET", f"/reef/records/{bad}", None),
        ]:
            statuses.append((f"{method} {path} {body}", raw_request(reef, method, path, body)[0]))
        decoded = bad.replace("%2f", "/").replace("%2e", ".").replace("%00", "\x00")
        for name in {bad, decoded}:
            statuses.append((f"create {name!r}", raw_request(reef, "POST", "/reef/scenarios", {"name": name})[0]))
            statuses.append(
                (f"report {name!r}", raw_request(reef, "POST", "/reef/report", {"references": [name], "score": 1})[0])
            )
            for header in ("x-reef-scenario", "x-reef-agent-record-id", "x-reef-session", "x-reef-release-id"):
                if "\x00" in name:
                    continue  # http.client refuses control characters in headers itself
                status, _ = raw_request(
                    reef, "POST", "/v1/chat/completions", {"model": "m", "messages": USER}, headers={header: name}
                )
                statuses.append((f"{header}: {name!r}", status))
    refused = [(what, status) for what, status in statuses if status not in (400, 404, 405, 409)]
    assert not refused, f"accepted or failed: {refused}"
    assert files_under(root) - before <= {"state/experience.db-journal"}, files_under(root) - before
    names = [s["name"] for s in httpx.get(f"{reef.url}/reef/scenarios", headers=auth()).json()["scenarios"]]
    assert names == names_before and "safe" in names
    assert len(httpx.get(f"{reef.url}/reef/scenarios/safe/releases", headers=auth()).json()["releases"]) == 1
