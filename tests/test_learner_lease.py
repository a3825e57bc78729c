"""One learner per scenario across a deployment (issue 15, part 3): two `reef serve` processes on
one throwaway PostgreSQL cluster of this module's own (so that it can be stopped and started)
and one artifact remote, in front of tests/scripted_upstream.py, recipe `skills` with the
model-free proposer and a gate on two task prompts the upstream answers slowly (so a batch stays
open long enough to kill its learner in the middle of it).

- exactly one front end runs the scenario's learner, and both name it;
- SIGKILL that one under load (plain and streaming requests, reports) while a batch is open: the
  other takes the lease within a few seconds and resumes the open batch (its records are all in
  the shared store: it is never abandoned for want of them), and the kill loop's accounting holds: every acknowledged receipt and report present once, the
  chain linear, no batch id logged twice, no batch closed twice, no record in two batches;
- PostgreSQL stopped under load: requests answer 503 in their dialect (OpenAI, Anthropic) while
  it is down; started again, both front ends serve again by themselves and exactly one holds
  the lease again;
- `reef serve --workers 2` on one port: two worker pids answer, one holds the lease, a rollback
  is served by both (each keep-alive connection stays with one worker).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from uuid import uuid4

import httpx
import pytest

from tests import pg
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream, _user_text

pytestmark = pytest.mark.postgres
SCENARIO = "lease"
GOOD, CHATTY = "4", "Sure! The answer is 4."
GATE_PROMPT = "gate task:"
GATE_DELAY_S = 1.5  # each gate answer: a batch stays open for a few seconds
FEEDBACK = ["Answer with a single word only.", "Only a single word answer, please.", "Answer with a single word only!"]
TAKEOVER_WITHIN_S = 5.0


def exact_answer(task: dict[str, Any], text: str) -> float:
    """The gate's scorer (loaded by dotted path in the servers)."""
    return 1.0 if text.strip() == task["expected"] else 0.0


class Cluster:
    """A throwaway PostgreSQL cluster that can be stopped and started again on its port."""

    def __init__(self) -> None:
        reason = pg._missing()
        if reason is not None:
            pytest.skip(reason)
        pg._remove_stale_clusters()
        self.root = pg._make_root()
        self.data = self.root / "data"
        pg.init_cluster(self.data)
        self.server, self.dsn = pg._start(self.root, self.data)
        self.port = int(dict(p.split("=", 1) for p in self.dsn.split())["port"])

    def stop(self) -> None:
        pg._stop(self.server, self.data)

    def start(self) -> None:
        self.server = pg._launch(self.root, self.data, self.port)
        assert pg._wait_ready(self.server, self.dsn), (self.root / "server.log").read_text()[-2000:]

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    pytest.importorskip("psycopg")
    c = Cluster()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(record=False) as up:
        up.answer_by_system({"single word": GOOD}, otherwise=CHATTY)
        answer = up.app._answer

        async def slow_gate(anthropic: bool, body: dict[str, Any], size: int, receive: Any, send: Any) -> None:
            if _user_text(body).startswith(GATE_PROMPT):
                await asyncio.sleep(GATE_DELAY_S)
            await answer(anthropic, body, size, receive, send)

        up.app._answer = slow_gate  # type: ignore[method-assign]
        yield up


def settings(root: Path, name: str, store: str, remote: Path, upstream: ScriptedUpstream, tasks: Path) -> dict:
    gate = {"tasks": str(tasks), "scorer": "tests.test_learner_lease:exact_answer", "margin": 1}
    return {
        "state_dir": str(root / name / "state"),
        "store": store,
        "artifacts": {"remote": str(remote)},
        "recipes": {"default": "skills"},
        "log_level": "info",
        "upstream": {"url": upstream.base_url, "model": "p", "timeout": 10},
        "learner": {
            "poll_interval": 0.05,
            "skills": {"proposer": "distill", "min_recurrence": 3, "batch_size": 8, "successes": 0, "gate": gate},
        },
    }


def start_all(servers: list[ReefServer]) -> None:
    errors: list[BaseException] = []

    def start(server: ReefServer) -> None:
        try:
            server.start()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors


def lease_of(server: ReefServer) -> tuple[str, dict | None]:
    learning = httpx.get(f"{server.url}/reef/status", timeout=10).json()["learning"]
    return learning["front_end"], next((x for x in learning["leases"] if x["scenario"] == SCENARIO), None)


def one_holder(servers: list[ReefServer]) -> ReefServer | None:
    """The one front end holding the lease, if exactly one does and every front end names it."""
    views = [lease_of(s) for s in servers]
    holding = [s for s, (_, lease) in zip(servers, views) if lease and lease["held_here"]]
    named = {lease["holder"] if lease else None for _, lease in views}
    if len(holding) == 1 and named == {views[servers.index(holding[0])][0]}:
        return holding[0]
    return None


def wait_for(what: str, condition: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Load:
    """Clients sending requests (30% streaming) and failure reports to the live front ends;
    everything acknowledged with a 2xx is collected."""

    def __init__(self, servers: list[ReefServer], clients: int = 3) -> None:
        self.servers = list(servers)
        self.receipts: dict[str, str] = {}
        self.reports: dict[str, str] = {}  # report id -> receipt
        self.attempted_reports = 0
        self.unavailable: list[httpx.Response] = []  # 503 answers (the database down)
        self.unexpected: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(clients)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            server = rng.choice(self.servers)
            try:
                self.exchange(server, rng)
            except httpx.HTTPError:
                time.sleep(0.05)  # a killed front end

    def exchange(self, server: ReefServer, rng: random.Random) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "What is 2+2?"}], "stream": rng.random() < 0.3}
        response = httpx.post(
            f"{server.base_url}/chat/completions", json=body, timeout=10, headers={"x-reef-scenario": SCENARIO}
        )
        if response.status_code == 503:
            with self.lock:
                self.unavailable.append(response)
            time.sleep(0.05)
            return
        if response.status_code != 200:
            self.unexpected.append(f"chat: {response.status_code} {response.text[:200]}")
            return
        receipt = response.headers["x-reef-agent-record-id"]
        with self.lock:
            self.receipts[receipt] = server.url
            self.attempted_reports += 1
        report = httpx.post(
            f"{server.url}/reef/report",
            timeout=10,
            json={"references": [receipt], "score": 0.0, "feedback": rng.choice(FEEDBACK)},
        )
        if report.status_code == 200:
            with self.lock:
                self.reports[report.json()["report_id"]] = receipt
        elif report.status_code != 503:
            self.unexpected.append(f"report: {report.status_code} {report.text[:200]}")


def commit_steps(dsn: str, database: str) -> list[dict]:
    import psycopg

    with psycopg.connect(dsn.replace("dbname=postgres", f"dbname={database}"), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT body FROM reef.commit_log WHERE scenario = %s ORDER BY step", (SCENARIO,)
        ).fetchall()
    return [json.loads(body) for (body,) in rows]


def check_accounting(server: ReefServer, load: Load, steps: list[dict]) -> None:
    """The kill loop's accounting, across the deployment, on one front end."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        attached: dict[str, int] = {}
        for receipt in load.receipts:
            got = http.get(f"/reef/records/{receipt}")
            assert got.status_code == 200, f"acknowledged receipt {receipt} is missing"
            ids = [r["id"] for r in got.json()["reports"]]
            assert len(ids) == len(set(ids)), f"a report is attached twice to {receipt}"
            for report_id in ids:
                attached[report_id] = attached.get(report_id, 0) + 1
        for report_id in load.reports:
            assert attached.get(report_id) == 1, f"acknowledged report {report_id} is missing or doubled"
        chain = http.get(f"/reef/scenarios/{SCENARIO}/releases").json()
        release_steps = [r["step"] for r in chain["releases"]]
        assert release_steps == sorted(release_steps, reverse=True) and len(set(release_steps)) == len(release_steps)
        assert chain["head"] == chain["releases"][0]["release_id"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1)), "the log is not linear"
    batches = [s["batch"] for s in steps if s["operation"] == "batch"]
    batch_ids = [b["batch_id"] for b in batches]
    assert len(batch_ids) == len(set(batch_ids)), f"a batch id is logged twice: {batch_ids}"
    records = [rid for b in batches for rid in b["record_ids"]]
    assert len(records) == len(set(records)), "a record is in two batches"
    closings = [
        s["metrics"]["batch_id"]
        for s in steps
        if s["operation"] in ("training", "rejection", "abandon") and s["metrics"].get("batch_id")
    ]
    assert len(closings) == len(set(closings)), f"a batch is closed twice: {closings}"
    assert set(closings) <= set(batch_ids)


def test_one_learner_per_scenario_survives_a_killed_holder_and_a_database_restart(
    cluster: Cluster, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    import psycopg

    database = f"reef_lease_{uuid4().hex[:10]}"
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    store = f"postgresql://postgres@127.0.0.1:{cluster.port}/{database}"
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--bare", "--quiet", str(remote)], check=True)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"prompt": f"{GATE_PROMPT} What is {i}+{4 - i}?", "expected": "4"}) + "\n" for i in range(2))
    )
    config = {name: settings(tmp_path, name, store, remote, upstream, tasks) for name in ("fe0", "fe1")}
    servers = [ReefServer(tmp_path / name, config[name]) for name in ("fe0", "fe1")]
    every = list(servers)
    started = time.monotonic()
    start_all(servers)
    try:
        assert httpx.post(f"{servers[0].url}/reef/scenarios", json={"name": SCENARIO}, timeout=10).status_code == 201
        holder = wait_for("one lease holder", lambda: one_holder(servers), 10)
        survivor = next(s for s in servers if s is not holder)
        assert lease_of(survivor)[1] is not None  # it wants the scenario too, and names the holder
        print(f"started in {time.monotonic() - started:.1f} s; holder :{holder.port}")

        # -- SIGKILL the holder while a batch is open, under load --------------------------------
        with Load(servers) as load:

            def open_batch() -> str | None:
                learner = httpx.get(f"{holder.url}/reef/scenarios/{SCENARIO}", timeout=5).json()["learner"]
                return learner["open_batches"][0]["batch_id"] if learner.get("open_batches") else None

            batch_id = wait_for("an open batch on the holder", open_batch, 30)
            holder.kill(signal.SIGKILL)
            killed_at = time.monotonic()
            load.servers = [survivor]
            wait_for("the survivor to take the lease", lambda: one_holder([survivor]), TAKEOVER_WITHIN_S)
            took = time.monotonic() - killed_at
            print(f"lease taken over {took:.2f} s after the SIGKILL")

            def closed() -> list[dict]:
                return [
                    s
                    for s in commit_steps(cluster.dsn, database)
                    if s["operation"] in ("training", "rejection", "abandon")
                    and s["metrics"].get("batch_id") == batch_id
                ]

            closing = wait_for(f"batch {batch_id} to be closed", closed, 20)
            time.sleep(1.0)  # more load on the survivor alone
        assert not load.unexpected, load.unexpected[:5]
        assert len(closing) == 1
        assert f"resuming batch {batch_id}" in survivor.logs(), survivor.logs()[-3000:]  # taken over, not dropped
        reason = closing[0]["metrics"].get("reason", "")
        assert not reason.startswith("cannot resume"), closing  # made into a candidate and judged (or superseded)
        print(f"batch {batch_id}: resumed, closed by {closing[0]['operation']} {reason}".rstrip())
        check_accounting(survivor, load, commit_steps(cluster.dsn, database))

        # -- PostgreSQL restarted under load ----------------------------------------------------
        restarted = ReefServer(tmp_path / "fe0", config["fe0"])
        every.append(restarted)
        restarted.start()  # the killed one comes back
        servers = [survivor, restarted]
        assert wait_for("one holder of two", lambda: one_holder(servers), 10) is survivor
        with Load(servers) as load2:
            wait_for("some load", lambda: len(load2.receipts) > 5, 10)
            cluster.stop()
            for server in servers:
                down = wait_for("a 503", lambda s=server: _unavailable(s, "openai"), 10)
                assert down.json()["error"]["type"] and down.json()["error"]["message"]
                down = wait_for("a 503", lambda s=server: _unavailable(s, "anthropic"), 10)
                assert down.json()["type"] == "error" and down.json()["error"]["message"]
            time.sleep(1.0)
            cluster.start()
            back_at = time.monotonic()
            for server in servers:
                wait_for("serving again", lambda s=server: _ask(s).status_code == 200, 15)
            holder = wait_for("one holder after the restart", lambda: one_holder(servers), 10)
            print(f"after the restart: serving and one lease holder in {time.monotonic() - back_at:.2f} s")
            time.sleep(0.5)
        assert load2.unavailable, "no request saw the database down"
        assert not load2.unexpected, load2.unexpected[:5]
        load.receipts.update(load2.receipts)
        load.reports.update(load2.reports)
        check_accounting(holder, load, commit_steps(cluster.dsn, database))
        for server in servers:
            assert lease_of(server)[0] and httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
    finally:
        for server in every:
            server.stop()


def _ask(server: ReefServer) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/chat/completions",
        headers={"x-reef-scenario": SCENARIO},
        timeout=10,
        json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
    )


def _unavailable(server: ReefServer, dialect: str) -> httpx.Response | None:
    if dialect == "openai":
        response = _ask(server)
    else:
        response = httpx.post(
            f"{server.base_url}/messages",
            headers={"x-reef-scenario": SCENARIO},
            timeout=10,
            json={"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
        )
    return response if response.status_code == 503 else None


# -- reef serve --workers N --------------------------------------------------------------------


def test_workers_share_one_port_one_learner_and_follow_a_rollback(
    cluster: Cluster, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    import os
    import sys

    import psycopg
    import yaml

    from tests.helpers.reef_server import ROOT, free_port

    database = f"reef_workers_{uuid4().hex[:10]}"
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": f"{GATE_PROMPT} What is 2+2?", "expected": "4"}) + "\n")
    port = free_port()
    config = settings(
        tmp_path,
        "w",
        f"postgresql://postgres@127.0.0.1:{cluster.port}/{database}",
        tmp_path / "unused",
        upstream,
        tasks,
    )
    del config["artifacts"]  # the supervisor makes <state_dir>/artifacts-remote.git
    config.update(port=port, log_level="warning")
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (tmp_path / "workers.log").open("ab") as log:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "reef", "serve", "-c", str(tmp_path / "w.yaml"), "--workers", "2"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    url = f"http://127.0.0.1:{port}"
    clients: list[httpx.Client] = []
    try:
        wait_for("the workers to answer", lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200, 60)
        assert httpx.post(f"{url}/reef/scenarios", json={"name": SCENARIO}, timeout=10).status_code == 201
        by_front_end: dict[str, httpx.Client] = {}  # one keep-alive connection stays with one worker
        deadline = time.monotonic() + 30
        while len(by_front_end) < 2 or any(lease is None for lease in _leases(by_front_end)):
            assert time.monotonic() < deadline, (
                f"workers seen: {list(by_front_end)}\n{(tmp_path / 'workers.log').read_text()[-3000:]}"
            )
            client = httpx.Client(base_url=url, timeout=10)
            clients.append(client)
            learning = client.get("/reef/status").json()["learning"]
            by_front_end.setdefault(learning["front_end"], client)
            time.sleep(0.05)
        pids = {name.rsplit(" ", 1)[1] for name in by_front_end}
        assert len(pids) == 2 and str(supervisor.pid) not in pids  # two worker processes answer on one port
        leases = _leases(by_front_end)
        assert sum(lease["held_here"] for lease in leases) == 1  # one learner across the workers
        assert {lease["holder"] for lease in leases} <= set(by_front_end)

        first = clients[0].get(f"/reef/scenarios/{SCENARIO}").json()["head"]["release_id"]
        rolled = clients[0].post(f"/reef/scenarios/{SCENARIO}/rollback", json={"release_id": first})
        assert rolled.status_code == 200, rolled.text
        release = rolled.json()["release"]["release_id"]
        for name, client in by_front_end.items():

            def served(c: httpx.Client = client) -> bool:
                return (
                    c.post(
                        "/v1/chat/completions",
                        headers={"x-reef-scenario": SCENARIO},
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                    ).headers["x-reef-release-id"]
                    == release
                )

            wait_for(f"{name} to serve the rollback", served, 2.0)
    finally:
        for client in clients:
            client.close()
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(timeout=60)
    assert supervisor.returncode == 0, (tmp_path / "workers.log").read_text()[-3000:]


def _leases(by_front_end: dict[str, httpx.Client]) -> list[dict | None]:
    out = []
    for client in by_front_end.values():
        leases = client.get("/reef/status").json()["learning"]["leases"]
        out.append(next((x for x in leases if x["scenario"] == SCENARIO and x["holder"]), None))
    return out
