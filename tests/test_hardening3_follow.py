"""A learner's publication is served by every front end within 2 s (issue 63, item 10).

The rollback was tested to be followed (tests/test_workers_state_dir.py, tests/test_deployment.py);
here the release comes from a real learner: recipe `skills` with the model-free proposer, the
scripted upstream answering in one word only when a rule asks for it, three failure reports with
the same feedback, the gate on a task file. Every front end is asked continuously from before the
publication; each must answer with the new release (`x-reef-release-id`) within 2 s of the time
the learner's step was logged (`recorded_at` of its decision).

- SQLite: `reef serve --workers 3` on one state directory (the learner on the worker holding the
  lease, the others following the JSONL log);
- PostgreSQL: two `reef serve` front ends on one database and one artifact remote (the other
  fetching the release's content from the remote).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self
from uuid import uuid4

import httpx
import pytest

from tests.helpers.reef_server import ReefServer
from tests.pg import postgres_dsn  # noqa: F401  (session fixture)
from tests.scripted_upstream import ScriptedUpstream
from tests.test_workers_state_dir import Workers

FOLLOW_WITHIN_S = 2.0
SCENARIO = "learned"
GOOD, CHATTY = "4", "Sure! The answer is 4."
FEEDBACK = ["Answer with a single word only.", "Only a single word answer, please.", "Answer with a single word only!"]


@pytest.fixture
def model() -> Iterator[ScriptedUpstream]:
    """The stand-in model: one word only when a rule in the system prompt asks for it."""
    with ScriptedUpstream(record=False) as upstream:
        upstream.answer_by_system({"single word": GOOD}, otherwise=CHATTY)
        yield upstream


def ask(client: httpx.Client) -> httpx.Response:
    response = client.post(
        "/v1/chat/completions",
        headers={"x-reef-scenario": SCENARIO},
        json={"model": "m", "messages": [{"role": "user", "content": "What is 2+2?"}]},
    )
    assert response.status_code == 200, response.text
    return response


class Watch:
    """One thread per front end asking again and again; when each answer arrived and its release."""

    def __init__(self, clients: list[httpx.Client]) -> None:
        self.seen: list[list[tuple[float, str]]] = [[] for _ in clients]
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i, c)) for i, c in enumerate(clients)]

    def run(self, i: int, client: httpx.Client) -> None:
        while not self.stop.is_set():
            try:
                release = ask(client).headers["x-reef-release-id"]
            except (AssertionError, httpx.HTTPError) as exc:
                self.errors.append(f"front end {i}: {exc}")
                return
            self.seen[i].append((time.time(), release))
            self.stop.wait(0.05)

    def first_served(self, release_id: str) -> list[float | None]:
        return [next((t for t, r in seen if r == release_id), None) for seen in self.seen]

    def __enter__(self) -> Self:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def published(client: httpx.Client) -> dict | None:
    rows = client.get(f"/reef/scenarios/{SCENARIO}/decisions").json()["decisions"]
    return next((d for d in rows if d["operation"] == "training" and d["verdict"]["decision"] == "select"), None)


def learn_and_measure(clients: list[httpx.Client]) -> list[float]:
    """Drive the learner to publish through the front ends; seconds from the logged step until
    each front end served the new release."""
    created = clients[0].post("/reef/scenarios", json={"name": SCENARIO})
    assert created.status_code == 201, created.text
    first = created.json()["head"]["release_id"]
    with Watch(clients) as watch:
        deadline = time.monotonic() + 30
        while any(first not in {r for _, r in seen} for seen in watch.seen):  # every one serves the first
            assert time.monotonic() < deadline and not watch.errors, watch.errors
            time.sleep(0.05)
        for i, feedback in enumerate(FEEDBACK):  # through each front end in turn
            client = clients[i % len(clients)]
            receipt = ask(client).headers["x-reef-agent-record-id"]
            report = client.post("/reef/report", json={"references": [receipt], "score": 0.0, "feedback": feedback})
            assert report.status_code == 200, report.text
        deadline = time.monotonic() + 90
        while (decision := published(clients[-1])) is None:
            assert time.monotonic() < deadline, "the learner published nothing"
            time.sleep(0.1)
        release, logged_at = decision["release_id"], decision["recorded_at"]
        deadline = time.monotonic() + 10
        while None in watch.first_served(release):
            assert time.monotonic() < deadline and not watch.errors, (
                f"front ends {[i for i, t in enumerate(watch.first_served(release)) if t is None]} never served "
                f"{release}; {watch.errors}"
            )
            time.sleep(0.05)
    assert not watch.errors, watch.errors
    return [t - logged_at for t in watch.first_served(release)]  # type: ignore[operator]


def test_a_learners_publication_is_served_by_every_worker_within_2_s(model: ScriptedUpstream, tmp_path: Path) -> None:
    workers = Workers(tmp_path, model)  # `reef serve --workers 3`, recipe skills, the gate on "What is 2+2?"
    try:
        clients = list(workers.by_worker(timeout=60).values())
        took = learn_and_measure(clients)
        print("learner's release served by each worker after", [f"{t:.3f} s" for t in took])
        assert max(took) < FOLLOW_WITHIN_S, took
    finally:
        workers.stop()


def test_a_learners_publication_is_served_by_every_postgres_front_end_within_2_s(
    model: ScriptedUpstream,
    postgres_dsn: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    psycopg = pytest.importorskip("psycopg")
    database = f"reef_follow_{uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    parts = dict(item.split("=", 1) for item in postgres_dsn.split())
    store = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{database}"
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--bare", "--quiet", str(remote)], check=True)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "What is 2+2?", "expected": "4"}) + "\n")
    gate = {"tasks": str(tasks), "scorer": "tests.test_workers_state_dir:exact_answer", "margin": 1}
    servers = [
        ReefServer(
            tmp_path / name,
            {
                "state_dir": str(tmp_path / name / "state"),
                "store": store,
                "artifacts": {"remote": str(remote)},
                "recipes": {"default": "skills"},
                "upstream": {"url": model.base_url, "model": "p", "timeout": 10},
                "learner": {
                    "poll_interval": 0.5,
                    "skills": {
                        "proposer": "distill",
                        "min_recurrence": 3,
                        "batch_size": 8,
                        "successes": 0,
                        "gate": gate,
                    },
                },
            },
        )
        for name in ("fe0", "fe1")
    ]
    clients: list[httpx.Client] = []
    try:
        for server in servers:
            server.start()
            clients.append(httpx.Client(base_url=server.url, timeout=10))
        took = learn_and_measure(clients)
        print("learner's release served by each front end after", [f"{t:.3f} s" for t in took])
        assert max(took) < FOLLOW_WITHIN_S, took
    finally:
        for client in clients:
            client.close()
        for server in servers:
            server.stop()
