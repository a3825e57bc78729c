"""A front end that cannot read a release's content (issue 63, item 5).

Before, a front end on PostgreSQL without the artifact remote answered 404 ("release ... is not
in the artifact store") to every request of a scenario another front end created or moved, and
started without a word. Now it keeps serving the last release it has loaded, says why in
`/reef/status` (`serving.unreachable[]`), its log and `/metrics`, answers 503 only where it has
nothing to serve, and catches up once the content is reachable; and `reef serve` on PostgreSQL
without `artifacts.remote` refuses to start, saying why and what to do.

Two real `reef serve` front ends on one real PostgreSQL database (skipped without it), each with
its own state directory: `a` publishes to remote R, `b` reads from R2, a copy of R taken once, so
what `a` publishes afterwards is out of `b`'s reach until R2 is brought up to date.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest

from tests.helpers.reef_server import ReefServer
from tests.helpers.reef_workers import ReefWorkers
from tests.pg import postgres_dsn  # noqa: F401  (session fixture)
from tests.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.postgres
WITHIN_S = 10.0  # the follower looks every second; a fetch and a load take well under a second here


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(record=False) as up:
        yield up


@pytest.fixture
def database(postgres_dsn: str) -> str:  # noqa: F811
    psycopg = pytest.importorskip("psycopg")
    name = f"reef_unreachable_{uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    parts = dict(item.split("=", 1) for item in postgres_dsn.split())
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{name}"


def front_end(workdir: Path, upstream: ScriptedUpstream, database: str, remote: Path | None) -> ReefServer:
    settings: dict[str, Any] = {
        "store": database,
        "recipes": {"default": "skills"},
        "learner": {"enabled": False},
        "upstream": {"url": upstream.base_url, "model": "p", "timeout": 5},
    }
    if remote is not None:
        settings["artifacts"] = {"remote": str(remote)}
    return ReefServer(workdir, settings)


def chat(server: ReefServer, scenario: str) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/chat/completions",
        headers={"x-reef-scenario": scenario},
        timeout=30,
        json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
    )


def unreachable(server: ReefServer) -> dict[str, dict[str, Any]]:
    status = httpx.get(f"{server.url}/reef/status", timeout=10).json()
    return {entry["scenario"]: entry for entry in status["serving"]["unreachable"]}


def gauge(server: ReefServer, serving: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    line = f'reef_scenarios_unreachable{{serving="{serving}"}} '
    return float(next(row for row in text.splitlines() if row.startswith(line)).split()[-1])


def wait_for(what: str, condition: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WITHIN_S
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {WITHIN_S} s: {what}"
        time.sleep(0.1)


def test_a_front_end_that_cannot_read_a_release_keeps_serving_what_it_has_and_says_why(
    tmp_path: Path, upstream: ScriptedUpstream, database: str
) -> None:
    remote, copy = tmp_path / "r.git", tmp_path / "r2.git"
    subprocess.run(["git", "init", "--bare", "--quiet", str(remote)], check=True)
    a = front_end(tmp_path / "a", upstream, database, remote).start()
    b = None
    try:
        first = chat(a, "s").headers["x-reef-release-id"]
        shutil.copytree(remote, copy)  # b's remote: what a published so far, and nothing after
        b = front_end(tmp_path / "b", upstream, database, copy).start()
        assert chat(b, "s").headers["x-reef-release-id"] == first
        assert unreachable(b) == {} and gauge(b, "older") == 0

        rolled = httpx.post(f"{a.url}/reef/scenarios/s/rollback", json={"release_id": first}, timeout=30)
        assert rolled.status_code == 200, rolled.text
        moved = rolled.json()["release"]["release_id"]
        behind = wait_for("b reports the head of s it cannot read", lambda: unreachable(b).get("s"))
        assert (behind["release_id"], behind["serving_release_id"]) == (moved, first)
        assert "not in the artifact store" in behind["reason"]
        answer = chat(b, "s")  # before: 404 once the serving release had to be loaded again
        assert answer.status_code == 200 and answer.headers["x-reef-release-id"] == first
        assert gauge(b, "older") == 1
        assert f"scenario s: cannot read release {moved}" in b.logs()

        created = httpx.post(f"{a.url}/reef/scenarios", json={"name": "t"}, timeout=30)
        assert created.status_code == 201, created.text
        wait_for("b reports t, which it has nothing of", lambda: "t" in unreachable(b))
        assert unreachable(b)["t"]["serving_release_id"] is None and gauge(b, "none") == 1
        refused = chat(b, "t")  # before: 404 "release ... is not in the artifact store"
        assert refused.status_code == 503, refused.text
        assert "no release this front end can serve" in refused.json()["error"]["message"]
        assert "artifacts.remote" in refused.json()["error"]["message"]

        # the content becomes reachable: b serves every head within its follower's second
        subprocess.run(["git", "--git-dir", str(copy), "fetch", "--quiet", str(remote), "+refs/*:refs/*"], check=True)
        wait_for("b serves the heads once it can read them", lambda: unreachable(b) == {})
        assert chat(b, "s").headers["x-reef-release-id"] == moved
        assert chat(b, "t").status_code == 200
        assert gauge(b, "older") == 0 and gauge(b, "none") == 0
        assert "scenario s: serving its head again" in b.logs()
    finally:
        for server in (a, b):
            if server is not None:
                server.stop()


def test_reef_serve_on_postgresql_without_an_artifact_remote_refuses_to_start(
    tmp_path: Path, upstream: ScriptedUpstream
) -> None:
    lone = front_end(tmp_path, upstream, "postgresql://reef@127.0.0.1:9/never", remote=None)
    with pytest.raises(RuntimeError, match="exited with 1") as refused:
        lone.start()
    lines = [line for line in lone.logs().splitlines() if line.strip()]
    assert lines == [lines[-1]] and lines[-1].startswith(
        "Error: refusing to serve a postgresql:// store without artifacts.remote"
    ), refused.value
    assert "--workers" in lines[-1] and "docs/deploy.md" in lines[-1]


def test_reef_serve_workers_on_postgresql_without_a_remote_make_their_own(
    tmp_path: Path, upstream: ScriptedUpstream, database: str
) -> None:
    settings = front_end(tmp_path, upstream, database, remote=None).settings
    own = {key: value for key, value in settings.items() if key not in ("port", "state_dir")}
    workers = ReefWorkers(tmp_path / "workers", own, workers=2).start()  # before and after: serves
    try:
        answer = httpx.post(
            f"{workers.url}/v1/chat/completions",
            headers={"x-reef-scenario": "s"},
            timeout=30,
            json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
        )
        assert answer.status_code == 200, answer.text
    finally:
        workers.stop()
