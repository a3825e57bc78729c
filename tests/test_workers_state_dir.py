"""Several processes on one state directory (SQLite, JSONL commit logs, one git repository):
`reef serve --workers N` without PostgreSQL (issue 15).

Unit level, with real processes on real files: appends from two processes with expected steps
stay one linear log; two processes publishing on one scenario get one winner a step and a linear
chain; the JSONL follower sees another process's append; the learner lease is a file lock that
the kernel frees when its holder is SIGKILLed; a half-written line is left alone while its writer
lives and cut once it died; two SQLite writers share the store; a writer killed again and again
beside a live one, with the state reopened meanwhile, loses nothing acknowledged.

The deployment: `reef serve --workers 3` on one state directory in front of the scripted upstream
(recipe `skills`): three workers answer on one port; a receipt from any worker is reported on any
other; a rollback through any worker is served by all within 2 s; two workers rolling back at once
get one winner a step; one worker holds a scenario's learner lease, and when it is SIGKILLed
another takes it within seconds (and the supervisor's restart opens the state beside live writers).
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import yaml

from reef.commit.commit_log import JsonlCommitLog, JsonlCommitLogs
from reef.commit.file_leases import FileLeases
from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.canonical import canonical_json
from reef.core.errors import Conflict, NotFound, StaleHead
from reef.core.types import ArtifactKind, CommitEntry, Operation, Record, RecordStatus, ReleaseRef, Report, Verdict
from reef.observe.sqlite_store import SQLiteStore
from tests.helpers.reef_server import ROOT, free_port
from tests.scripted_upstream import ScriptedUpstream

FOLLOW_WITHIN_S = 2.0
TAKEOVER_WITHIN_S = 5.0
WORKERS = 3
SELECT = Verdict("select", {"wins": 1})
FORK = multiprocessing.get_context("fork")


def wait_for(what: str, condition: Callable[[], Any], timeout: float) -> Any:
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


def step(n: int, who: str) -> CommitEntry:
    return CommitEntry(
        scenario="s",
        step=n,
        operation=Operation.CREATION if n == 1 else Operation.TRAINING,
        release=ReleaseRef(f"r{n}-{who}", f"c{n}-{who}"),
    )


def candidate(n: int) -> Candidate:
    return Candidate(
        {"adapter_config.json": b'{"r": 8}', "adapter_model.safetensors": n.to_bytes(4, "big") * 256},
        ArtifactKind.WEIGHTS,
    )


# -- the JSONL commit log across processes -------------------------------------------------------


def _append_until(path: str, who: str, last: int, out: Any) -> None:
    """A child: append its own step on whatever the last step is, until the log has `last`."""
    log, won = JsonlCommitLog(path, scenario="s"), []
    while (head := log.last_step) < last:
        try:
            log.append(step(head + 1, who), expected_step=head)
            won.append(head + 1)
        except (StaleHead, Conflict):  # the other process took step head + 1 first
            pass
    out.put((who, won))


def test_two_processes_appending_with_expected_steps_keep_one_linear_log(tmp_path: Path) -> None:
    path = str(tmp_path / "s.jsonl")
    JsonlCommitLog(path, scenario="s").append(step(1, "x"), expected_step=0)
    out = FORK.Queue()
    procs = [FORK.Process(target=_append_until, args=(path, who, 60, out)) for who in ("a", "b")]
    for p in procs:
        p.start()
    won = dict(out.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(timeout=10)
    entries = JsonlCommitLog(path, scenario="s").entries()
    assert [e.step for e in entries] == list(range(1, 61))
    assert sorted(won["a"] + won["b"]) == list(range(2, 61))  # each step won exactly once
    for e in entries[1:]:
        assert e.release.release_id == f"r{e.step}-{'a' if e.step in won['a'] else 'b'}"
    assert len(Path(path).read_bytes().splitlines()) == 60


def _publish_rounds(root: str, who: int, rounds: int, barrier: Any, out: Any) -> None:
    """A child: open the shared state directory, publish on the head each round at once with the other."""
    with ReefState.open(root, shared=True) as state:
        chain = state.create("s", "sao")
        for r in range(rounds):
            barrier.wait()
            head = chain.head().release_id
            barrier.wait()  # both hold the same head now
            try:
                out.put((r, who, chain.publish(candidate(10 * r + who), head, verdict=SELECT).release_id))
            except StaleHead:
                out.put((r, who, None))
            barrier.wait()


def test_two_processes_publishing_on_one_state_directory_have_one_winner_each_step(tmp_path: Path) -> None:
    rounds, barrier, out = 3, FORK.Barrier(2), FORK.Queue()
    procs = [FORK.Process(target=_publish_rounds, args=(str(tmp_path), who, rounds, barrier, out)) for who in (1, 2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in range(2 * rounds)]
    for p in procs:
        p.join(timeout=20)
        assert p.exitcode == 0
    winners = []
    for r in range(rounds):
        won = [release for round_, _, release in results if round_ == r and release is not None]
        assert len(won) == 1, results  # one winner, one StaleHead
        winners.append(won[0])
    with ReefState.open(tmp_path) as state:
        history = state.chain("s").history()
        assert [e.step for e in history] == list(range(1, rounds + 2))
        assert [e.release.release_id for e in history[1:]] == winners  # linear: each on the one before
        assert [e.parent_release_id for e in history[2:]] == winners[:-1]
        assert state.artifacts.scenario_head("s") == winners[-1]
        git = subprocess.run(
            ["git", "--git-dir", str(tmp_path / "artifacts.git"), "rev-list", "--first-parent", winners[-1]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert git[:rounds] == winners[::-1]


def _append_one(path: str) -> None:
    log = JsonlCommitLog(path, scenario="s")
    log.append(step(log.last_step + 1, "child"), expected_step=log.last_step)


def test_a_follower_sees_another_process_append_within_a_poll(tmp_path: Path) -> None:
    logs = JsonlCommitLogs(tmp_path / "commits", shared=True)
    path = logs.path_of("s")
    JsonlCommitLog(path, scenario="s").append(step(1, "x"), expected_step=0)
    watch = logs.watch()
    try:
        assert watch.wait(1.0)  # the first wait returns at once: the caller looks once
        assert logs.heads() == {"s": 1}
        assert not watch.wait(0.3)  # nothing changed
        start = time.monotonic()
        child = FORK.Process(target=_append_one, args=(str(path),))
        child.start()
        assert watch.wait(5.0)
        child.join(timeout=10)
        assert wait_for("the new step", lambda: logs.heads() == {"s": 2}, 2.0)
        assert time.monotonic() - start < 1.0
        with path.open("ab") as f:
            f.write(b'{"half": ')  # an append in progress: not a step yet
        assert logs.heads() == {"s": 2}
    finally:
        watch.close()


# -- torn lines: repaired once by the lock holder, never under a live writer ---------------------------


def _write_half_then(path: str, line: bytes, ready: Any, go: Any) -> None:
    """A child writer: hold the log's flock, write half a line, wait; finish it on `go` (or die)."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, line[: len(line) // 2])
    ready.set()
    go.wait(30)
    os.write(fd, line[len(line) // 2 :])
    os.fsync(fd)
    fcntl.flock(fd, fcntl.LOCK_UN)


def test_a_half_written_line_is_left_alone_while_its_writer_lives(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    JsonlCommitLog(path, scenario="s").append(step(1, "x"), expected_step=0)
    line = canonical_json(step(2, "live").to_json()).encode() + b"\n"
    ready, go = FORK.Event(), FORK.Event()
    writer = FORK.Process(target=_write_half_then, args=(str(path), line, ready, go))
    writer.start()
    assert ready.wait(10)
    seen: list[list[CommitEntry]] = []
    reader = threading.Thread(target=lambda: seen.append(JsonlCommitLog(path, scenario="s").entries()))
    reader.start()  # opening reads under the flock: it waits for the writer
    reader.join(timeout=0.5)
    assert reader.is_alive() and path.read_bytes().endswith(line[: len(line) // 2])  # not truncated
    go.set()
    reader.join(timeout=10)
    writer.join(timeout=10)
    assert [e.release.release_id for e in seen[0]] == ["r1-x", "r2-live"]


def test_a_torn_line_of_a_killed_writer_is_cut_once_by_whoever_locks_first(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    JsonlCommitLog(path, scenario="s").append(step(1, "x"), expected_step=0)
    whole = path.read_bytes()
    ready, never = FORK.Event(), FORK.Event()
    writer = FORK.Process(
        target=_write_half_then,
        args=(str(path), canonical_json(step(2, "dead").to_json()).encode() + b"\n", ready, never),
    )
    writer.start()
    assert ready.wait(10)
    os.kill(writer.pid, signal.SIGKILL)  # the kernel drops its flock
    writer.join(timeout=10)
    assert len(path.read_bytes()) > len(whole)
    barrier, seen = threading.Barrier(3), []

    def open_and_append(who: str) -> None:
        barrier.wait()
        log = JsonlCommitLog(path, scenario="s")
        try:
            seen.append(log.append(step(2, who), expected_step=1).release.release_id)
        except Conflict:  # step 2 is another's already
            seen.append(None)
        finally:
            log.close()

    openers = [threading.Thread(target=open_and_append, args=(w,)) for w in ("a", "b", "c")]
    for t in openers:
        t.start()
    for t in openers:
        t.join(timeout=10)
    entries = JsonlCommitLog(path, scenario="s").entries()
    won = [s for s in seen if s is not None]
    assert len(seen) == 3 and len(won) == 1 and [e.release.release_id for e in entries] == ["r1-x", won[0]]
    assert path.read_bytes() == whole + canonical_json(entries[1].to_json()).encode() + b"\n"


# -- the learner lease as a file lock ------------------------------------------------------------------


def _hold_lease(directory: str, ready: Any) -> None:
    leases = FileLeases(directory, "child holder")
    assert leases.try_take("s")
    ready.set()
    time.sleep(60)


def test_the_learner_lease_is_a_file_lock_freed_when_its_holder_is_killed(tmp_path: Path) -> None:
    ready = FORK.Event()
    holder = FORK.Process(target=_hold_lease, args=(str(tmp_path), ready))
    holder.start()
    assert ready.wait(10)
    here, there = FileLeases(tmp_path, "here"), FileLeases(tmp_path, "there")
    try:
        assert not here.try_take("s") and here.holders(["s", "t"]) == {"s": "child holder", "t": None}
        os.kill(holder.pid, signal.SIGKILL)
        start = time.monotonic()
        holder.join(timeout=10)
        assert here.try_take("s") and time.monotonic() - start < 1.0
        assert here.keep() == {"s"} and not there.try_take("s")  # one holder, even within a process
        assert there.holders(["s"]) == {"s": "here"}
        here.release("s")
        assert there.holders(["s"]) == {"s": None} and there.try_take("s")
        there.path_of("s").unlink()  # someone cleared leases/
        assert there.keep() == set()  # a replaced lock file is a lost lease
    finally:
        here.close()
        there.close()


# -- the SQLite store shared by processes ----------------------------------------------------------


def _write_records(db: str, who: str, n: int, start: Any) -> None:
    store = SQLiteStore(db)
    start.wait(10)
    for i in range(n):
        rid = f"{who}-{i}"
        store.put_record(
            Record(
                id=rid,
                scenario="s",
                release=ReleaseRef("r", "c"),
                request={"i": i},
                status=RecordStatus.COMPLETE,
                response={"text": "x"},
            )
        )
        other = f"{'b' if who == 'a' else 'a'}-{i}"
        refs = (rid, other) if _exists(store, other) else (rid,)  # the other process's record, when there
        store.put_report(Report(id=f"rep-{rid}", scenario="s", references=refs, score=1.0))
    store.close()


def _exists(store: SQLiteStore, record_id: str) -> bool:
    try:
        store.get_record(record_id)
        return True
    except NotFound:
        return False


def test_two_processes_write_one_sqlite_store(tmp_path: Path) -> None:
    db = str(tmp_path / "experience.db")
    SQLiteStore(db).close()  # WAL set once, as the supervisor's open does
    start = FORK.Event()
    procs = [FORK.Process(target=_write_records, args=(db, who, 150, start)) for who in ("a", "b")]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    store = SQLiteStore(db)
    try:
        assert store.count_records("s") == 300 and store.count_reports("s") == 300
        crossed = [r for r in store.reported_since("s", 0, 1000) if len({rec.id[0] for rec in r.records}) == 2]
        assert crossed, "a report named a record the other process wrote"
    finally:
        store.close()


# -- a writer killed again and again beside a live one ------------------------------------------------


class Writer:
    """tests/helpers/crash_writer.py in a child process; its acknowledgement lines."""

    def __init__(self, root: Path, run: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.child = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.crash_writer", str(root), run],
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env,
            bufsize=0,
        )
        assert self.child.stdout is not None
        assert self.child.stdout.readline().strip() == b"READY"
        self.output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.child.stdout is not None
        while chunk := self.child.stdout.read(65536):
            self.output += chunk

    def kill(self) -> list[str]:
        self.child.send_signal(signal.SIGKILL)
        self.child.wait(timeout=10)
        self._reader.join(timeout=10)
        return [line.decode() for line in bytes(self.output).split(b"\n")[:-1] if line]


def test_a_writer_killed_beside_a_live_one_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(20260715)
    steady, acked = Writer(tmp_path, "steady"), []
    for run in range(4):
        victim = Writer(tmp_path, f"victim{run}")  # its open runs recovery while `steady` writes
        time.sleep(rng.uniform(0.1, 0.5))
        with ReefState.open(tmp_path, shared=True) as state:  # and so does ours
            assert state.chain("crash").history()
        acked += victim.kill()
    time.sleep(0.3)
    acked += steady.kill()
    with ReefState.open(tmp_path) as state:
        entries = state.chain("crash").history()
        assert [e.step for e in entries] == list(range(1, len(entries) + 1))
        logged = [e.release.release_id for e in entries if e.publishes_release]
        assert len(logged) == len(set(logged))
        for line in acked:
            kind, *rest = line.split()
            if kind == "R":
                assert state.store.get_record(rest[0]).id == rest[0]
            elif kind == "P":
                assert state.store.get_report(rest[0]).id == rest[0]
            elif kind == "S":
                assert entries[int(rest[0]) - 1].release.release_id == rest[1]
        assert state.artifacts.scenario_head("crash") == logged[-1]
    assert sum(line.startswith("S ") for line in acked) >= 2, "both writers should publish between kills"


# -- reef serve --workers 3 on one state directory -----------------------------------------------------


def exact_answer(task: dict[str, Any], text: str) -> float:
    """The skills gate's scorer (loaded by dotted path in the workers)."""
    return 1.0 if text.strip() == task["expected"] else 0.0


class Workers:
    def __init__(self, root: Path, upstream: ScriptedUpstream) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        tasks = root / "tasks.jsonl"
        tasks.write_text(json.dumps({"prompt": "What is 2+2?", "expected": "4"}) + "\n")
        gate = {"tasks": str(tasks), "scorer": f"{__name__}:exact_answer", "margin": 1}
        settings = {
            "state_dir": str(root / "state"),
            "port": self.port,
            "log_level": "warning",
            "keep_alive_timeout": 120,
            "recipes": {"default": "skills"},
            "upstream": {"url": upstream.base_url, "model": "p", "timeout": 10},
            "learner": {
                "poll_interval": 0.5,
                "skills": {"proposer": "distill", "min_recurrence": 3, "batch_size": 8, "successes": 0, "gate": gate},
            },
        }
        (root / "reef.yaml").write_text(yaml.safe_dump(settings))
        self.log = root / "workers.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        for name in ("REEF_TOKEN", "REEF_UPSTREAM_URL", "REEF_UPSTREAM_API_KEY", "REEF_UPSTREAM_MODEL"):
            env.pop(name, None)
        with self.log.open("ab") as log:
            self.supervisor = subprocess.Popen(
                [sys.executable, "-m", "reef", "serve", "-c", str(root / "reef.yaml"), "--workers", str(WORKERS)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=root,
            )
        self.clients: list[httpx.Client] = []

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def by_worker(self, n: int = WORKERS, timeout: float = 30.0) -> dict[str, httpx.Client]:
        """One keep-alive client per worker (a connection stays with the worker that accepted it),
        by the worker's name (`host:port pid N`); new connections until `n` workers answered."""
        found: dict[str, httpx.Client] = {}
        deadline = time.monotonic() + timeout
        while len(found) < n:
            assert time.monotonic() < deadline, f"workers seen: {list(found)}\n{self.logs()}"
            client = httpx.Client(base_url=self.url, timeout=10)
            self.clients.append(client)
            try:
                name = client.get("/reef/status").json()["learning"]["front_end"]
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            found.setdefault(name, client)
        return found

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.supervisor.send_signal(signal.SIGTERM)
        try:
            self.supervisor.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.supervisor.kill()
            self.supervisor.wait()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    with ScriptedUpstream(record=False) as upstream:
        w = Workers(tmp_path_factory.mktemp("workers"), upstream)
        try:
            wait_for("the workers to answer", lambda: httpx.get(f"{w.url}/healthz", timeout=1).status_code == 200, 60)
            yield w
        finally:
            w.stop()


def ask(client: httpx.Client, scenario: str) -> httpx.Response:
    response = client.post(
        "/v1/chat/completions",
        headers={"x-reef-scenario": scenario},
        json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
    )
    assert response.status_code == 200, response.text
    return response


def served_by_all_within(clients: list[httpx.Client], scenario: str, release_id: str) -> float:
    start = time.monotonic()
    waiting = list(clients)
    while waiting:
        waiting = [c for c in waiting if ask(c, scenario).headers["x-reef-release-id"] != release_id]
        elapsed = time.monotonic() - start
        assert elapsed < FOLLOW_WITHIN_S or not waiting, (
            f"{len(waiting)} workers serve another release after {elapsed:.2f} s"
        )
        if waiting:
            time.sleep(0.05)
    return time.monotonic() - start


def test_workers_answer_on_one_port_from_one_state_directory(workers: Workers) -> None:
    found = workers.by_worker()
    pids = {name.rsplit(" ", 1)[1] for name in found}
    assert len(pids) == WORKERS and str(workers.supervisor.pid) not in pids
    assert not (workers.root / "state" / "workers").exists()  # one state directory, not one each
    assert (workers.root / "state" / "experience.db").is_file()


def test_a_receipt_from_any_worker_is_reported_on_any_other(workers: Workers) -> None:
    clients = list(workers.by_worker().values())
    for i, client in enumerate(clients):
        receipt = ask(client, "receipts").headers["x-reef-agent-record-id"]
        reporter, reader = clients[(i + 1) % WORKERS], clients[(i + 2) % WORKERS]
        report = reporter.post("/reef/report", json={"references": [receipt], "score": 1.0})
        assert report.status_code == 200, report.text
        got = reader.get(f"/reef/records/{receipt}").json()
        assert [r["id"] for r in got["reports"]] == [report.json()["report_id"]]


def test_a_rollback_through_any_worker_is_served_by_all_within_2_s(workers: Workers) -> None:
    clients = list(workers.by_worker().values())
    created = clients[0].post("/reef/scenarios", json={"name": "follow"})
    assert created.status_code == 201, created.text
    first = created.json()["head"]["release_id"]
    served_by_all_within(clients, "follow", first)  # created through one, known to all
    for client in (clients[1], clients[2], clients[0]):
        rolled = client.post("/reef/scenarios/follow/rollback", json={"release_id": first})
        assert rolled.status_code == 200, rolled.text
        took = served_by_all_within(clients, "follow", rolled.json()["release"]["release_id"])
        print(f"rollback served by all {WORKERS} workers in {took:.3f} s")
    steps = [r["step"] for r in clients[2].get("/reef/scenarios/follow/releases").json()["releases"]]
    assert steps == [4, 3, 2, 1]


def test_a_scenario_created_through_one_worker_is_known_at_once_to_another(workers: Workers) -> None:
    clients = list(workers.by_worker().values())
    first = clients[0].post("/reef/scenarios", json={"name": "at-once"}).json()["head"]["release_id"]
    rolled = clients[1].post("/reef/scenarios/at-once/rollback", json={"release_id": first})  # no follower wait
    assert rolled.status_code == 200, rolled.text


def test_two_workers_rolling_back_at_once_have_one_winner_each_step(workers: Workers) -> None:
    clients = list(workers.by_worker().values())
    first = clients[1].post("/reef/scenarios", json={"name": "race"}).json()["head"]["release_id"]
    head, winners = first, []
    for _ in range(3):
        results: list[httpx.Response | None] = [None, None]
        barrier = threading.Barrier(2)

        def roll(i: int) -> None:
            barrier.wait()
            results[i] = clients[i].post(
                "/reef/scenarios/race/rollback", timeout=30, json={"release_id": first, "expected_head": head}
            )

        threads = [threading.Thread(target=roll, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(r.status_code for r in results if r is not None) == [200, 409], [
            r.text for r in results if r is not None
        ]
        head = next(r for r in results if r is not None and r.status_code == 200).json()["release"]["release_id"]
        winners.append(head)
    releases = clients[2].get("/reef/scenarios/race/releases").json()["releases"]
    assert [r["release_id"] for r in releases] == [*winners[::-1], first]
    assert [r["step"] for r in releases] == [4, 3, 2, 1]
    served_by_all_within(clients, "race", winners[-1])


def lease(client: httpx.Client, scenario: str) -> dict | None:
    leases = client.get("/reef/status").json()["learning"]["leases"]
    return next((x for x in leases if x["scenario"] == scenario), None)


def test_one_worker_holds_a_lease_and_another_takes_it_when_the_holder_is_killed(workers: Workers) -> None:
    found = workers.by_worker()
    clients = list(found.values())
    assert clients[0].post("/reef/scenarios", json={"name": "lease"}).status_code == 201

    def one_holder() -> str | None:
        seen = [lease(c, "lease") for c in clients]
        holders = {x["holder"] for x in seen if x}
        if len(holders) != 1 or None in holders or sum(bool(x and x["held_here"]) for x in seen) != 1:
            return None
        return holders.pop()

    holder = wait_for("one worker to hold the lease, named by all", one_holder, 10)
    assert holder in found and lease(found[holder], "lease")["held_here"]
    assert found[holder].get("/reef/status").json()["learning"]["lease_kind"] == "file lock"
    os.kill(int(holder.rsplit(" ", 1)[1]), signal.SIGKILL)
    start = time.monotonic()

    def taken() -> str | None:  # a survivor holds it, and every survivor names it (not the dead one)
        seen = {name: lease(c, "lease") for name, c in found.items() if name != holder}
        here = [name for name, x in seen.items() if x and x["held_here"]]
        agreed = len(here) == 1 and all(x and x["holder"] == here[0] for x in seen.values())
        return here[0] if agreed else None

    new_holder = wait_for("a survivor to take the lease", taken, TAKEOVER_WITHIN_S)
    took = time.monotonic() - start
    print(f"lease taken over in {took:.2f} s")
    assert new_holder != holder and took < TAKEOVER_WITHIN_S
    restarted = workers.by_worker(timeout=40)  # the supervisor starts the killed worker again on the live state
    assert holder not in restarted and new_holder in restarted
    again = [c for name, c in restarted.items() if name not in found]
    assert len(again) == 1 and ask(again[0], "follow").status_code == 200
