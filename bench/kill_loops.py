"""Kill loops: real `reef serve` processes SIGKILLed again and again under mixed load, and what
every acknowledged answer became.

Three loops, each in front of the scripted upstream (tests/scripted_upstream.py, a real HTTP
server; upstream runtime, recipe `skills`) with several concurrent clients
(tests/helpers/mixed_load.py): chat completions through the official openai SDK, a share of
them streamed, to several scenarios; reports on a share of the receipts; now and then a
rollback of a scenario to its first release.

1. `one`: one `reef serve`, SIGKILLed at random moments and started again each time.
2. `sqlite`: `reef serve --workers 3` on one state directory (SQLite); SIGKILLs of random
   workers (the supervisor starts them again) and of the supervisor (the bench starts it again).
3. `postgres`: `reef serve --workers 3` on PostgreSQL (a throwaway cluster, tests/pg.py) beside a
   second front end (another `reef serve` on its own port, same database, same artifact remote);
   SIGKILLs of workers, the supervisor and the second front end, and `--pg-stops` stops and starts
   of PostgreSQL itself (alternately `-m immediate` and `-m fast`) while the clients go on.

After every restart (and every PostgreSQL start) and at the end of each loop, the acknowledged
(2xx) receipts, reports and releases are counted against the store and the chains
(tests/helpers/acked_check.py): present, lost, duplicated. Whenever the state is offline (loop 1
after each kill, loop 2 after a supervisor kill, every loop at the end), `reef inspect` runs on
it (a copy of the crashed state, so the restart still recovers the original) and must exit 0
naming no stale lock, and the bare git repositories must hold no `*.lock` file. On PostgreSQL
`reef inspect` runs with `--store` where it has that option, and the same check runs in-process
(the state opened on the database and the artifact remote, every release's artifacts verified).
5xx answers and connection failures seen by the clients (expected while a front end is down) are
counted apart, by operation, as is the time each restart took to serve a chat completion again.

Prints a table per loop and a summary; writes bench/results/kill_loops.json. Exits 1 when
anything acknowledged was lost or duplicated, an inspection was not clean, or a loop could not
go on (a front end that would not serve again, a supervisor that gave up). Not in CI
(tests/test_kill_loops_bench.py runs a few kills of it). Run on its own:

    HF_HUB_OFFLINE=1 .venv/bin/python bench/kill_loops.py [--loops one,sqlite,postgres]
        [--kills 64,24,16] [--seed 1] [--clients 4] [--gap 0.3:2.5] [--pg-stops 2]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx

from reef.observe.store import ExperienceStore
from tests.helpers.acked_check import CheckResult, check
from tests.helpers.mixed_load import (
    MESSAGES,
    Ledger,
    LoadShape,
    MixedLoad,
    PinnedRollback,
)
from tests.helpers.process_tree import kill_tree
from tests.helpers.reef_server import ReefServer
from tests.helpers.reef_workers import ReefWorkers
from tests.scripted_upstream import ScriptedUpstream

LOOPS = ("one", "sqlite", "postgres")
DEFAULT_KILLS = "64,24,16"
SCENARIOS = ("kill-a", "kill-b", "kill-c")
WORKERS = 3
SERVE_AGAIN_TIMEOUT_S = 120.0
ORPHAN_GRACE_S = 3.0
ROLLBACK_WINDOW_S = 0.15  # a kill aimed at a rollback lands this long after it was sent, at most  # how long the workers of a killed supervisor may take to die
TITLES = {
    "one": "one process",
    "sqlite": f"--workers {WORKERS} on SQLite",
    "postgres": f"--workers {WORKERS} + a second front end on PostgreSQL",
}


class LoopAborted(Exception):
    """The deployment could not be brought back; the loop ends here (a failure)."""


@dataclass
class LoopRecord:
    name: str
    kills_planned: int
    kills: collections.Counter[str] = field(default_factory=collections.Counter)
    events: list[dict[str, Any]] = field(default_factory=list)  # one per kill or PostgreSQL stop
    serve_again_s: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    checks: list[CheckResult] = field(default_factory=list)
    inspections: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why
    locks_left_by_kills: list[str] = field(default_factory=list)
    final: CheckResult | None = None
    ledger: Ledger | None = None
    fsck: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def say(self, text: str) -> None:
        print(
            f"  [{self.name} {time.monotonic() - self.started:7.1f} s] {text}",
            flush=True,
        )

    def fail(self, text: str) -> None:
        self.failures.append(text)
        self.say(f"FAILURE: {text.splitlines()[0]}")

    def inspected(self, result: dict[str, Any]) -> None:
        self.inspections.append(result)
        if not result["clean"]:
            locks = result.get("git_lock_files", [])
            self.fail(
                f"{result['what']} not clean: rc {result['rc']}, lines naming a stale lock "
                f"{result['stale_locks']}, *.lock files left in git {locks}\n{result['output']}"
            )

    def checked(self, result: CheckResult, when: str) -> None:
        self.checks.append(result)
        if not result.ok:
            self.fail(f"check {when}: {json.dumps(result.to_json())[:1500]}")


# -- serving again, inspecting offline ------------------------------------------------------------


def serve_again(urls: list[str], since: float, timeout: float = SERVE_AGAIN_TIMEOUT_S) -> float:
    """Seconds from `since` until every url answers a chat completion with 200."""
    deadline = time.monotonic() + timeout
    waiting = list(urls)
    while waiting:
        url = waiting[0]
        try:
            answer = httpx.post(
                f"{url}/v1/chat/completions",
                timeout=5,
                headers={"x-reef-scenario": SCENARIOS[0]},
                json={"model": "m", "messages": MESSAGES},
            )
            if answer.status_code == 200:
                waiting.pop(0)
                continue
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise LoopAborted(f"{url} did not serve a chat completion again within {timeout:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - since


def stale_git_locks(*roots: Path) -> list[str]:
    """`*.lock` files inside bare git repositories under `roots` (offline: no writer is alive)."""
    found = []
    for root in roots:
        for path in root.rglob("*.lock") if root.exists() else ():
            if any(part.endswith(".git") for part in path.relative_to(root).parts[:-1]):
                found.append(str(path))
    return sorted(found)


def reef_inspect(state_dir: Path, what: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """`reef inspect` on `state_dir`: clean when it exits 0 and names no lock other than the
    stale ones its recovery removed (a git killed mid-write leaves those; recovery's job)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reef",
            "inspect",
            "--state-dir",
            str(state_dir),
            *extra,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    text = done.stdout + done.stderr
    lines = text.splitlines()
    removed = [line for line in lines if "removed a stale" in line.lower()]
    named = [line for line in lines if "lock" in line.lower() and line not in removed]
    return {
        "what": what,
        "rc": done.returncode,
        "stale_locks": named,
        "locks_removed": removed,
        "clean": done.returncode == 0 and not named,
        "seconds": round(time.monotonic() - started, 2),
        "output": "" if done.returncode == 0 else text[-2000:],
    }


def inspect_crashed(state_dir: Path, scratch: Path, what: str, git_roots: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Inspect a copy of a crashed (offline) state directory, so the restart recovers the
    original as it was left. The git locks the kill left in the original are listed (expected
    when a git died with its process: the restart must clear them, see `locks_persisting`)."""
    locks = stale_git_locks(state_dir, *git_roots)
    copy = scratch / "inspected"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(state_dir, copy, symlinks=True)
    try:
        result = reef_inspect(copy, what)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    result["locks_left_by_kill"] = lock_identities(locks)
    return result


def lock_identities(paths: list[str]) -> dict[str, list[int]]:
    """Each lock file's inode and mtime: the same file, still there later, was never cleared."""
    found = {}
    for path in paths:
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            continue
        found[path] = [stat.st_ino, stat.st_mtime_ns]
    return found


def locks_persisting(left: dict[str, list[int]]) -> list[str]:
    """The lock files of `left` that are still there, the very same files."""
    now = lock_identities(list(left))
    return sorted(path for path, identity in left.items() if now.get(path) == identity)


def git_fsck(repository: Path) -> str:
    done = subprocess.run(
        ["git", "--git-dir", str(repository), "fsck", "--no-progress"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return "clean" if done.returncode == 0 else f"rc {done.returncode}: {(done.stdout + done.stderr)[-500:]}"


# -- what every loop shares ----------------------------------------------------------------------


@dataclass
class Settings:
    kills: int
    seed: int
    gap: tuple[float, float]
    shape: LoadShape
    supervisor_share: float
    pg_stops: int
    workdir: Path
    # the share of kills aimed at a process while it runs a rollback
    in_rollback: float = 0.0
    # the share of kills that take the victim's child processes too
    tree_share: float = 0.0


def base_settings(upstream: ScriptedUpstream) -> dict[str, Any]:
    return {
        "recipes": {"default": "skills"},
        "upstream": {"url": upstream.base_url, "model": "p", "timeout": 5},
    }


def create_scenarios(url: str) -> dict[str, str]:
    first = {}
    for scenario in SCENARIOS:
        created = httpx.post(f"{url}/reef/scenarios", json={"name": scenario}, timeout=30)
        created.raise_for_status()
        first[scenario] = created.json()["head"]["release_id"]
    return first


def run_checked(
    record: LoopRecord,
    ledger: Ledger,
    open_store: Callable[[], ExperienceStore],
    urls: list[str],
    rng: random.Random,
    when: str,
) -> CheckResult:
    result = check(ledger.snapshot(), open_store, urls, rng)
    record.checked(result, when)
    return result


def kill_mid_rollback(url: str, ledger: Ledger, rng: random.Random, tree: bool) -> dict[str, Any] | None:
    """Send a rollback on a connection to a known process and SIGKILL that process (`strike`)
    a random moment later, while the rollback's git and commit-log writes may be running (where a
    stale `*.lock` comes from). None when no process answered to be aimed at."""
    pinned = PinnedRollback(url, rng.choice(ledger.scenarios), ledger)
    if pinned.pid is None:
        pinned.finish()
        return None
    pinned.start()
    delay = rng.uniform(0.0, ROLLBACK_WINDOW_S)
    time.sleep(delay)
    strike(pinned.pid, tree)
    pinned.finish()
    return {"pid": pinned.pid, "mid_rollback_after_s": round(delay, 3)}


def strike(pid: int, tree: bool) -> None:
    """SIGKILL `pid`; with `tree`, its descendants (a `git` it runs) in the same sweep."""
    if tree:
        kill_tree(pid)
    else:
        os.kill(pid, signal.SIGKILL)


def mid(event: dict[str, Any]) -> str:
    after = event.get("mid_rollback_after_s")
    return "" if after is None else f" {after:.3f} s into a rollback"


def pause(rng: random.Random, gap: tuple[float, float]) -> None:
    """Until the random moment of the next kill, the load going on."""
    time.sleep(rng.uniform(*gap))


# -- loop 1: one process --------------------------------------------------------------------------


def loop_one(upstream: ScriptedUpstream, s: Settings, record: LoopRecord) -> None:
    from reef.observe.sqlite_store import SQLiteStore

    rng = random.Random(s.seed)
    root = s.workdir / "one"
    reef = ReefServer(root, base_settings(upstream)).start()
    state = reef.state_dir

    def open_store() -> ExperienceStore:
        return SQLiteStore(state / "experience.db")

    ledger = Ledger(create_scenarios(reef.url))
    record.ledger = ledger
    load = MixedLoad([reef.url], ledger, rng.randrange(2**32), s.shape).start()
    try:
        for n in range(1, s.kills + 1):
            pause(rng, s.gap)
            ledger.phase = "after a kill"
            pid = reef.process.pid if reef.process else -1
            tree = rng.random() < s.tree_share
            aimed = None
            if rng.random() < s.in_rollback:
                aimed = kill_mid_rollback(reef.url, ledger, rng, tree)
            if aimed is None:
                strike(pid, tree)
            reef.kill()  # reaps it
            reef.stop()  # closes its log; the process is gone
            record.kills["serve"] += 1
            crashed = inspect_crashed(state, root, f"reef inspect after kill {n}")
            record.inspected(crashed)
            started = time.monotonic()
            try:
                reef.start()
            except RuntimeError as exc:
                raise LoopAborted(f"reef serve did not start after kill {n}: {exc}") from None
            took = serve_again([reef.url], started)
            record.serve_again_s["serve"].append(took)
            ledger.phase = "steady"  # served again
            result = run_checked(record, ledger, open_store, [reef.url], rng, f"after kill {n}")
            left = crashed["locks_left_by_kill"]
            fail_if_persisting(record, left, f"kill {n}")
            record.events.append(
                {
                    "kill": n,
                    "victim": "serve",
                    "pid": pid,
                    "tree": tree,
                    **(aimed or {}),
                    "locks_left_by_kill": sorted(left),
                    "serve_again_s": round(took, 3),
                    "check_ok": result.ok,
                }
            )
            record.say(
                f"kill {n}/{s.kills}: serve pid {pid}{mid(aimed or {})}; serving again in {took:.2f} s; "
                f"{result.receipts.acked} receipts, check {'ok' if result.ok else 'FAILED'}"
            )
    finally:
        load.stop()
        finish(record, ledger, open_store, [reef.url], rng, reef.stop)
        inspect_at_end(record, state)


def stale_lock_result(root: Path, what: str, *more: Path) -> dict[str, Any]:
    locks = stale_git_locks(root, *more)
    return {
        "what": what,
        "rc": 0,
        "stale_locks": [],
        "git_lock_files": locks,
        "clean": not locks,
        "output": "",
    }


def inspect_at_end(record: LoopRecord, state: Path) -> None:
    """Everything stopped: `reef inspect` on the state itself, stale git locks, git fsck."""
    record.inspected(reef_inspect(state, "reef inspect at the end"))
    record.inspected(stale_lock_result(state, "git locks at the end"))
    record.fsck["artifacts.git"] = git_fsck(state / "artifacts.git")


def finish(
    record: LoopRecord,
    ledger: Ledger,
    open_store: Callable[[], ExperienceStore],
    urls: list[str],
    rng: random.Random,
    stop: Callable[[], Any],
) -> None:
    """The load stopped: the last check while serving, then stop."""
    try:
        record.final = check(ledger.snapshot(), open_store, urls, rng)
        record.checked(record.final, "at the end")
    except Exception as exc:  # noqa: BLE001  the deployment may be down for good: say so, stop it anyway
        record.fail(f"final check could not run: {type(exc).__name__}: {exc}")
    finally:
        stop()


# -- loop 2: --workers on SQLite ------------------------------------------------------------------


def kill_a_worker(
    workers: ReefWorkers,
    rng: random.Random,
    record: LoopRecord,
    n: int,
    aim_at_rollback: Ledger | None = None,
    tree: bool = False,
) -> dict[str, Any]:
    """SIGKILL one worker (with `aim_at_rollback`, the one running a rollback sent for the
    purpose); seconds until the supervisor's replacement answers a request."""
    before = set(workers.worker_pids())
    if not before:
        raise LoopAborted(f"no worker alive before kill {n}:\n{workers.logs()}")
    aimed = None
    if aim_at_rollback is not None:
        aimed = kill_mid_rollback(workers.url, aim_at_rollback, rng, tree)
    pid = aimed["pid"] if aimed else rng.choice(sorted(before))
    if aimed is None:
        strike(pid, tree)
    killed_at = time.monotonic()
    record.kills["worker"] += 1
    deadline = killed_at + SERVE_AGAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        if not workers.supervisor_alive:
            return {
                "victim": "worker",
                "pid": pid,
                "supervisor_exited": workers.supervisor.returncode,
            }  # type: ignore[union-attr]
        new = set(workers.worker_pids()) - before
        if new and workers.pid_serving() in new:
            took = time.monotonic() - killed_at
            record.serve_again_s["worker"].append(took)
            return {
                "victim": "worker",
                "pid": pid,
                "tree": tree,
                **(aimed or {}),
                "serve_again_s": round(took, 3),
            }
        time.sleep(0.05)
    record.fail(  # the others still serve: go on
        f"no replacement for worker {pid} served within {SERVE_AGAIN_TIMEOUT_S:.0f} s:\n{workers.logs()}"
    )
    return {
        "victim": "worker",
        "pid": pid,
        "tree": tree,
        **(aimed or {}),
        "not_replaced": True,
    }


def orphans_after(workers: ReefWorkers) -> list[int]:
    """Workers still alive ORPHAN_GRACE_S after their supervisor died."""
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while workers.worker_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    return workers.worker_pids()


def restart_supervisor(
    workers: ReefWorkers,
    record: LoopRecord,
    why: str,
    inspect: Callable[[], dict[str, list[int]]],
) -> float:
    """The supervisor is gone (killed, or it gave up): clear what it left, inspect offline
    (`inspect` returns the git locks the kill left), start it; the locks must be gone."""
    orphans = orphans_after(workers)
    if orphans:
        record.fail(
            f"{len(orphans)} workers outlived their supervisor ({why}); a new supervisor on the port "
            f"would find it taken; killing pids {orphans}"
        )
        workers.kill_workers()
    left = inspect()
    started = time.monotonic()
    try:
        workers.start()
    except RuntimeError as exc:
        raise LoopAborted(f"reef serve --workers did not start again ({why}): {exc}") from None
    took = serve_again([workers.url], started)
    fail_if_persisting(record, left, why)
    return took


def fail_if_persisting(record: LoopRecord, left: dict[str, list[int]], why: str) -> None:
    """After a restart: the git locks a kill left must be gone (the same files, still there,
    were never cleared)."""
    record.locks_left_by_kills += sorted(left)
    if persisting := locks_persisting(left):
        record.fail(f"git locks left by {why} are still there after the restart: {persisting}")


def loop_sqlite(upstream: ScriptedUpstream, s: Settings, record: LoopRecord) -> None:
    from reef.observe.sqlite_store import SQLiteStore

    rng = random.Random(s.seed + 1)
    root = s.workdir / "sqlite"
    workers = ReefWorkers(root, base_settings(upstream), workers=WORKERS).start()
    state = Path(workers.settings["state_dir"])

    def open_store() -> ExperienceStore:
        return SQLiteStore(state / "experience.db")

    def inspect(n: int) -> Callable[[], dict[str, list[int]]]:
        def run() -> dict[str, list[int]]:
            crashed = inspect_crashed(state, root, f"reef inspect after kill {n}")
            record.inspected(crashed)
            return crashed["locks_left_by_kill"]

        return run

    ledger = Ledger(create_scenarios(workers.url))
    record.ledger = ledger
    load = MixedLoad([workers.url], ledger, rng.randrange(2**32), s.shape).start()
    try:
        for n in range(1, s.kills + 1):
            pause(rng, s.gap)
            ledger.phase = "after a kill"
            if not workers.supervisor_alive:
                record.fail(
                    f"the supervisor exited with {workers.supervisor.returncode} on its own before kill {n}:"  # type: ignore[union-attr]
                    f"\n{workers.logs(1500)}"
                )
                took = restart_supervisor(workers, record, "it exited", inspect(n))
                record.serve_again_s["supervisor"].append(took)
            tree = rng.random() < s.tree_share
            if rng.random() < s.supervisor_share:
                event = kill_supervisor(workers, record, n, inspect(n), tree)
            else:
                aim = ledger if rng.random() < s.in_rollback else None
                event = kill_a_worker(workers, rng, record, n, aim, tree)
                if "supervisor_exited" in event:
                    record.fail(
                        f"the supervisor exited with {event['supervisor_exited']} after worker kill {n} "
                        f"(one sick worker took the service down):\n{workers.logs(1500)}"
                    )
                    took = restart_supervisor(workers, record, "it gave up", inspect(n))
                    record.serve_again_s["supervisor"].append(took)
                    event["serve_again_s"] = round(took, 3)
            ledger.phase = "steady"  # served again
            result = run_checked(record, ledger, open_store, [workers.url], rng, f"after kill {n}")
            record.events.append({"kill": n, **event, "check_ok": result.ok})
            record.say(
                f"kill {n}/{s.kills}: {event['victim']} pid {event['pid']}{mid(event)}; serving again in "
                f"{event.get('serve_again_s', float('nan')):.2f} s; {result.receipts.acked} receipts, "
                f"check {'ok' if result.ok else 'FAILED'}"
            )
    finally:
        load.stop()
        finish(
            record,
            ledger,
            open_store,
            [workers.url],
            rng,
            lambda: stop_workers(workers, record),
        )
        inspect_at_end(record, state)


def kill_supervisor(
    workers: ReefWorkers,
    record: LoopRecord,
    n: int,
    inspect: Callable[[], None],
    tree: bool = False,
) -> dict[str, Any]:
    """SIGKILL the supervisor (with `tree`: with its workers and their children, the whole
    service at once), start it again."""
    pid = workers.supervisor.pid if workers.supervisor else -1
    if tree and pid > 0:
        kill_tree(pid)
    workers.kill_supervisor()
    record.kills["supervisor"] += 1
    took = restart_supervisor(workers, record, f"kill {n}", inspect)
    record.serve_again_s["supervisor"].append(took)
    return {
        "victim": "supervisor",
        "pid": pid,
        "tree": tree,
        "serve_again_s": round(took, 3),
    }


def stop_workers(workers: ReefWorkers, record: LoopRecord) -> None:
    status = workers.stop()
    if status not in (0, None):
        record.fail(f"the supervisor exited with {status} when stopped:\n{workers.logs(1500)}")


# -- loop 3: --workers and a second front end on PostgreSQL ---------------------------------------


@dataclass
class PgDeployment:
    workers: ReefWorkers
    front: ReefServer
    store_url: str
    remote: Path
    root: Path

    @property
    def urls(self) -> list[str]:
        return [self.workers.url, self.front.url]

    def worker_locks(self) -> dict[str, list[int]]:
        """The git locks in the workers' own state directories (offline: all workers dead)."""
        return lock_identities(stale_git_locks(Path(self.workers.settings["state_dir"])))

    def local_dirs(self) -> list[Path]:
        return [Path(self.workers.settings["state_dir"]), self.front.state_dir]


def start_pg_deployment(upstream: ScriptedUpstream, root: Path, store_url: str) -> PgDeployment:
    remote = root / "remote.git"
    subprocess.run(["git", "init", "--bare", "--quiet", str(remote)], check=True)
    shared = {
        **base_settings(upstream),
        "store": store_url,
        "artifacts": {"remote": str(remote)},
    }
    workers = ReefWorkers(root / "workers", shared, workers=WORKERS).start()
    front = ReefServer(root / "front", shared).start()
    return PgDeployment(workers, front, store_url, remote, root)


def loop_postgres(upstream: ScriptedUpstream, s: Settings, record: LoopRecord) -> None:
    from tests.helpers.pg_cluster import PgCluster

    rng = random.Random(s.seed + 2)
    root = s.workdir / "postgres"
    root.mkdir(parents=True, exist_ok=True)
    cluster = PgCluster().start()
    try:
        store_url = cluster.create_database("reef_kill_loops")
        deployment = start_pg_deployment(upstream, root, store_url)
        run_postgres_kills(upstream, s, record, rng, cluster, deployment)
    finally:
        cluster.close()


def run_postgres_kills(
    upstream: ScriptedUpstream,
    s: Settings,
    record: LoopRecord,
    rng: random.Random,
    cluster: Any,
    d: PgDeployment,
) -> None:
    from reef.observe.postgres_store import PostgresStore

    def open_store() -> ExperienceStore:
        return PostgresStore(d.store_url, pool_size=2)

    ledger = Ledger(create_scenarios(d.workers.url))
    record.ledger = ledger
    load = MixedLoad(d.urls, ledger, rng.randrange(2**32), s.shape).start()
    stops_before = {(i + 1) * s.kills // (s.pg_stops + 1) + 1 for i in range(s.pg_stops)}
    try:
        for n in range(1, s.kills + 1):
            pause(rng, s.gap)
            ledger.phase = "after a kill"
            if n in stops_before:
                stop_postgres(cluster, d, rng, record, n, ledger, open_store)
                ledger.phase = "after a kill"
            bring_back(d, record, n)
            event = kill_pg_part(d, rng, record, n, s, ledger)
            ledger.phase = "steady"  # served again
            result = run_checked(record, ledger, open_store, d.urls, rng, f"after kill {n}")
            record.events.append({"kill": n, **event, "check_ok": result.ok})
            record.say(
                f"kill {n}/{s.kills}: {event['victim']} pid {event['pid']}{mid(event)}; serving again in "
                f"{event.get('serve_again_s', float('nan')):.2f} s; {result.receipts.acked} receipts, "
                f"check {'ok' if result.ok else 'FAILED'}"
            )
    finally:
        load.stop()
        finish(
            record,
            ledger,
            open_store,
            d.urls,
            rng,
            lambda: (stop_workers(d.workers, record), d.front.stop()),
        )
        inspect_postgres(d, record)


def stop_postgres(
    cluster: Any,
    d: PgDeployment,
    rng: random.Random,
    record: LoopRecord,
    n: int,
    ledger: Ledger,
    open_store: Callable[[], ExperienceStore],
) -> None:
    """Stop PostgreSQL (alternately -m immediate and -m fast) under load, start it again; the
    seconds until both front ends serve, and a check."""
    mode = "immediate" if sum(1 for e in record.events if e.get("victim") == "postgres") % 2 == 0 else "fast"
    down = rng.uniform(1.0, 4.0)
    ledger.phase = "postgres down"
    cluster.stop(mode)
    time.sleep(down)  # the clients go on against a database that is not there
    started = time.monotonic()
    cluster.start()
    bring_back(d, record, n)
    took = serve_again(d.urls, started)
    record.serve_again_s["postgres"].append(took)
    ledger.phase = "steady"  # served again
    result = run_checked(
        record,
        ledger,
        open_store,
        d.urls,
        rng,
        f"after PostgreSQL stop before kill {n}",
    )
    record.events.append(
        {
            "victim": "postgres",
            "mode": mode,
            "down_s": round(down, 2),
            "serve_again_s": round(took, 3),
            "check_ok": result.ok,
        }
    )
    record.say(
        f"PostgreSQL stopped (-m {mode}) for {down:.1f} s; both front ends serving {took:.2f} s after its "
        f"start; check {'ok' if result.ok else 'FAILED'}"
    )


def bring_back(d: PgDeployment, record: LoopRecord, n: int) -> None:
    """A front end that exited on its own (e.g. while the database was away) is a failure; start it again."""
    if not d.workers.supervisor_alive:
        record.fail(
            f"the supervisor exited with {d.workers.supervisor.returncode} on its own before kill {n}:"  # type: ignore[union-attr]
            f"\n{d.workers.logs(1500)}"
        )
        record.serve_again_s["supervisor"].append(restart_supervisor(d.workers, record, "it exited", d.worker_locks))
    if d.front.process is None or d.front.process.poll() is not None:
        code = d.front.process.returncode if d.front.process else None
        record.fail(f"the second front end exited with {code} on its own before kill {n}:\n{d.front.logs()[-1500:]}")
        d.front.stop()
        record.serve_again_s["front end"].append(restart_front(d, n))


def restart_front(d: PgDeployment, n: int) -> float:
    started = time.monotonic()
    try:
        d.front.start()
    except RuntimeError as exc:
        raise LoopAborted(f"the second front end did not start again (kill {n}): {exc}") from None
    return serve_again([d.front.url], started)


def kill_pg_part(
    d: PgDeployment,
    rng: random.Random,
    record: LoopRecord,
    n: int,
    s: Settings,
    ledger: Ledger,
) -> dict[str, Any]:
    """SIGKILL the supervisor, the second front end or a worker, and bring it back."""
    supervisor_share, tree = s.supervisor_share, rng.random() < s.tree_share
    roll = rng.random()
    if roll < supervisor_share:
        return kill_supervisor(
            d.workers,
            record,
            n,
            d.worker_locks,
            tree,
        )
    if roll < supervisor_share + (1 - supervisor_share) / 3:
        pid = d.front.process.pid if d.front.process else -1
        aimed = None
        if rng.random() < s.in_rollback:
            aimed = kill_mid_rollback(d.front.url, ledger, rng, tree)
        if aimed is None:
            strike(pid, tree)
        d.front.kill()  # reaps it
        d.front.stop()
        record.kills["front end"] += 1
        left = lock_identities(stale_git_locks(d.front.state_dir))
        took = restart_front(d, n)
        fail_if_persisting(record, left, f"kill {n} of the front end")
        record.serve_again_s["front end"].append(took)
        return {
            "victim": "front end",
            "pid": pid,
            "tree": tree,
            **(aimed or {}),
            "serve_again_s": round(took, 3),
        }
    aim = ledger if rng.random() < s.in_rollback else None
    event = kill_a_worker(d.workers, rng, record, n, aim, tree)
    if "supervisor_exited" in event:
        record.fail(
            f"the supervisor exited with {event['supervisor_exited']} after worker kill {n}:\n{d.workers.logs(1500)}"
        )
        took = restart_supervisor(d.workers, record, "it gave up", d.worker_locks)
        record.serve_again_s["supervisor"].append(took)
        event["serve_again_s"] = round(took, 3)
    return event


def inspect_postgres(d: PgDeployment, record: LoopRecord) -> None:
    """Everything stopped: the state on the database and the remote, checked offline."""
    record.inspected(inspect_in_process(d))
    if (
        "--store"
        in subprocess.run(
            [sys.executable, "-m", "reef", "inspect", "--help"],
            check=False,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        ).stdout
    ):
        record.inspected(
            reef_inspect(
                d.front.state_dir,
                "reef inspect --store at the end",
                ("--store", d.store_url),
            )
        )
    else:
        record.notes.append(
            "reef inspect has no --store: it cannot read a PostgreSQL deployment (checked in-process only)"
        )
        record.say(record.notes[-1])
    record.inspected(stale_lock_result(d.remote.parent, "git locks at the end", *d.local_dirs()))
    record.fsck["remote.git"] = git_fsck(d.remote)


def inspect_in_process(d: PgDeployment) -> dict[str, Any]:
    """What `reef inspect` does (open with recovery, verify every release's artifacts), on the
    PostgreSQL store and the artifact remote, from a fresh state directory."""
    from reef.commit.state import ReefState
    from reef.core.errors import ReefError
    from reef.observe.postgres_store import PostgresStore

    fresh = d.root / "inspect-state"
    shutil.rmtree(fresh, ignore_errors=True)
    started = time.monotonic()
    try:
        with ReefState.open(
            fresh,
            store=PostgresStore(d.store_url, pool_size=2),
            artifacts_remote=str(d.remote),
        ) as state:
            state.verify_artifacts()
            heads = {name: state.chain(name).last_step() for name in state.scenarios()}
        rc, output = 0, json.dumps(heads)
    except ReefError as exc:
        rc, output = 1, str(exc)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return {
        "what": "inspect in-process on PostgreSQL + remote at the end",
        "rc": rc,
        "stale_locks": [],
        "clean": rc == 0,
        "seconds": round(time.monotonic() - started, 2),
        "output": output[-2000:],
    }


# -- tables -----------------------------------------------------------------------------------------


def summarize(record: LoopRecord) -> dict[str, Any]:
    ledger = record.ledger or Ledger({})
    final = record.final
    outcomes = {f"{op} {kind}": n for (op, kind), n in sorted(ledger.outcomes.items())}
    restarts = {
        what: {
            "count": len(v),
            "median_s": round(statistics.median(v), 2),
            "max_s": round(max(v), 2),
        }
        for what, v in record.serve_again_s.items()
        if v
    }
    inspections = record.inspections
    return {
        "loop": record.name,
        "title": TITLES[record.name],
        "kills_planned": record.kills_planned,
        "sigkills": dict(record.kills),
        "sigkills_total": sum(record.kills.values()),
        "sigkills_mid_rollback": sum(1 for e in record.events if "mid_rollback_after_s" in e),
        "sigkills_with_children": sum(1 for e in record.events if e.get("tree")),
        "postgres_stops": sum(1 for e in record.events if e.get("victim") == "postgres"),
        "seconds": round(record.seconds, 1),
        "final": final.to_json() if final else None,
        "checks": len(record.checks),
        "checks_failed": sum(1 for c in record.checks if not c.ok),
        "in_progress_max": max((c.in_progress for c in record.checks), default=0),
        "inspections": len(inspections),
        "inspections_clean": sum(1 for i in inspections if i["clean"]),
        "git_locks_left_by_kills": record.locks_left_by_kills,
        "git_locks_removed_by_inspect": sum(len(i.get("locks_removed", [])) for i in inspections),
        "git_lock_files_at_the_end": sorted({f for i in inspections for f in i.get("git_lock_files", [])}),
        "client_answers": outcomes,
        "failures_by_phase": {f"{phase}: {kind}": n for (phase, kind), n in sorted(ledger.failures_by_phase.items())},
        "unexpected_samples": ledger.samples,
        "connection_errors": dict(ledger.connection_errors.most_common(20)),
        "rollback_s": _spread(ledger.rollback_seconds),
        "serve_again": restarts,
        "fsck": record.fsck,
        "failures": record.failures,
        "notes": record.notes,
        "events": record.events,
        "inspection_details": [i for i in inspections if not i["clean"]],
    }


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "median_s": round(statistics.median(ordered), 3),
        "p95_s": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
        "max_s": round(ordered[-1], 3),
    }


def print_table(row: dict[str, Any]) -> None:
    print(
        f"\nloop {row['loop']}: {row['title']}: {row['sigkills_total']} SIGKILLs {row['sigkills']}"
        f" ({row['sigkills_mid_rollback']} aimed at a rollback in flight, "
        f"{row['sigkills_with_children']} with the victim's child processes)"
        + (f", {row['postgres_stops']} PostgreSQL stops" if row["postgres_stops"] else "")
        + f", {row['seconds']:.0f} s"
    )
    final = row["final"]
    if final:
        print(f"  {'':10}{'acked':>8}{'present':>9}{'lost':>6}{'duplicated':>12}")
        for kind in ("receipts", "reports", "releases"):
            c = final[kind]
            print(f"  {kind:10}{c['acked']:>8}{c['present']:>9}{c['lost']:>6}{c['duplicated']:>12}")
        print(
            f"  wrong scenario {final['wrong_scenario']}; records left in_progress {final['in_progress']}; "
            f"reports stored but never acknowledged {final['stored_reports_not_acked']}"
        )
    print(
        f"  checks: {row['checks'] - row['checks_failed']}/{row['checks']} ok; inspections clean: "
        f"{row['inspections_clean']}/{row['inspections']}; fsck: {row['fsck']}"
    )
    print(
        f"  git locks left by kills: {len(row['git_locks_left_by_kills'])}, removed by reef inspect: "
        f"{row['git_locks_removed_by_inspect']}, left at the end: {len(row['git_lock_files_at_the_end'])}"
    )
    answers = row["client_answers"]
    for kind in ("5xx", "conn", "cut", "refused", "4xx", "409", "error"):
        got = {k.split()[0]: n for k, n in answers.items() if k.endswith(" " + kind)}
        if got:
            print(f"  client answers {kind}: {got}")
    print(f"  client answers 2xx: { {k.split()[0]: n for k, n in answers.items() if k.endswith(' 2xx')} }")
    steady = {k: n for k, n in row["failures_by_phase"].items() if k.startswith("steady")}
    print(f"  failures while nothing was down (steady): {steady or 'none'}")
    for what, r in row["serve_again"].items():
        print(f"  serving again after {what}: {r['count']} times, median {r['median_s']} s, max {r['max_s']} s")
    if row["rollback_s"]:
        r = row["rollback_s"]
        print(
            f"  rollbacks acknowledged: {r['count']}, median {r['median_s']} s, p95 {r['p95_s']} s, max {r['max_s']} s"
        )
    for note in row["notes"]:
        print(f"  note: {note}")
    for failure in row["failures"]:
        print(f"  FAILURE: {failure.splitlines()[0][:200]}")


def print_summary(rows: list[dict[str, Any]], seconds: float) -> None:
    print("\nsummary")
    print(
        f"  {'loop':10}{'kills':>6}{'receipts':>10}{'reports':>9}{'releases':>10}{'lost':>6}{'dup':>5}"
        f"{'5xx':>6}{'conn':>6}{'refused':>8}{'inspect':>9}{'failures':>10}"
    )
    for row in rows:
        final = row["final"] or {}
        acked = [final.get(k, {}).get("acked", 0) for k in ("receipts", "reports", "releases")]
        lost = sum(final.get(k, {}).get("lost", 0) for k in ("receipts", "reports", "releases"))
        dup = sum(final.get(k, {}).get("duplicated", 0) for k in ("receipts", "reports", "releases"))
        answers = row["client_answers"]
        fivexx = sum(n for k, n in answers.items() if k.endswith(" 5xx"))
        conn = sum(n for k, n in answers.items() if k.endswith((" conn", " cut")))
        refused = sum(n for k, n in answers.items() if k.endswith(" refused"))
        print(
            f"  {row['loop']:10}{row['sigkills_total']:>6}{acked[0]:>10}{acked[1]:>9}{acked[2]:>10}{lost:>6}"
            f"{dup:>5}{fivexx:>6}{conn:>6}{refused:>8}{row['inspections_clean']:>4}/{row['inspections']:<4}"
            f"{len(row['failures']):>10}"
        )
    total = sum(r["sigkills_total"] for r in rows)
    print(f"  {total} SIGKILLs in all, {sum(r['postgres_stops'] for r in rows)} PostgreSQL stops, {seconds:.0f} s")


# -- the command --------------------------------------------------------------------------------------


def parse_kills(text: str, loops: list[str]) -> dict[str, int]:
    """`N` (every loop) or `N1,N2,N3` (one per loop of `--loops`, in its order)."""
    parts = [int(p) for p in text.split(",")]
    if any(p < 0 for p in parts) or len(parts) not in (1, len(loops)):
        raise argparse.ArgumentTypeError(f"--kills: one count or one per loop ({len(loops)}), got {text!r}")
    return dict(zip(loops, parts * len(loops) if len(parts) == 1 else parts))


def parse_gap(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    gap = (float(low), float(high or low))
    if not 0 <= gap[0] <= gap[1]:
        raise argparse.ArgumentTypeError(f"--gap: MIN:MAX with 0 <= MIN <= MAX, got {text!r}")
    return gap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    parser.add_argument(
        "--loops",
        default=",".join(LOOPS),
        help=f"which loops to run, comma-separated, in this order (default: {','.join(LOOPS)})",
    )
    parser.add_argument(
        "--kills",
        default=DEFAULT_KILLS,
        help="SIGKILLs per loop: one count for every loop, or one per loop of --loops "
        f"(default: {DEFAULT_KILLS}, {sum(map(int, DEFAULT_KILLS.split(',')))} in all)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1,
        help="seeds the kill moments, the victims and the clients' choices (default: 1)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=4,
        help="concurrent client threads per loop (default: 4)",
    )
    parser.add_argument(
        "--stream-share",
        type=float,
        default=0.3,
        help="share of chat completions streamed (default: 0.3)",
    )
    parser.add_argument(
        "--report-share",
        type=float,
        default=0.5,
        help="share of receipts a report is sent for (default: 0.5)",
    )
    parser.add_argument(
        "--rollback-share",
        type=float,
        default=0.04,
        help="chance, after each answered chat completion, of a rollback of its scenario to its "
        "first release (default: 0.04)",
    )
    parser.add_argument(
        "--gap",
        type=parse_gap,
        default=(0.3, 2.5),
        metavar="MIN:MAX",
        help="seconds of load between the service answering again and the next kill, drawn "
        "uniformly (default: 0.3:2.5)",
    )
    parser.add_argument(
        "--supervisor-share",
        type=float,
        default=0.25,
        help="loops sqlite and postgres: the share of kills aimed at the supervisor rather than a "
        "worker (postgres: the rest split 1:2 between the second front end and a worker; "
        "default: 0.25)",
    )
    parser.add_argument(
        "--kill-in-rollback",
        type=float,
        default=0.3,
        metavar="SHARE",
        help="the share of kills of a serving process (not the supervisor) aimed at it while it runs a "
        "rollback: a rollback is sent on a connection to it and the SIGKILL follows 0-0.15 s later, "
        "inside its git and commit-log writes (default: 0.3)",
    )
    parser.add_argument(
        "--tree-share",
        type=float,
        default=0.5,
        metavar="SHARE",
        help="the share of kills that SIGKILL the victim's child processes in the same sweep, as a "
        "container stop or a cgroup kill does (a git the victim runs dies with it; a supervisor "
        "takes its workers along); the others SIGKILL the one process, as the OOM killer does "
        "(default: 0.5)",
    )
    parser.add_argument(
        "--pg-stops",
        type=int,
        default=2,
        help="loop postgres: stops and starts of PostgreSQL during the loop (default: 2)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the state directories go (default: a temporary directory, deleted at the end unless --keep)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the state directories and logs for a post-mortem",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results" / "kill_loops.json",
        help="the JSON results (default: bench/results/kill_loops.json)",
    )
    args = parser.parse_args(argv)
    args.loops = [name.strip() for name in args.loops.split(",") if name.strip()]
    unknown = [name for name in args.loops if name not in LOOPS]
    if unknown or not args.loops:
        parser.error(f"--loops: choose among {', '.join(LOOPS)}; got {unknown or 'none'}")
    try:
        args.kills = parse_kills(args.kills, args.loops)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        parser.error(str(exc))
    return args


RUNNERS = {"one": loop_one, "sqlite": loop_sqlite, "postgres": loop_postgres}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="reef-kill-loops-"))
    shape = LoadShape(
        clients=args.clients,
        stream_share=args.stream_share,
        report_share=args.report_share,
        rollback_share=args.rollback_share,
    )
    rows = []
    with ScriptedUpstream(record=False) as upstream:
        for name in args.loops:
            settings = Settings(
                args.kills[name],
                args.seed,
                args.gap,
                shape,
                args.supervisor_share,
                args.pg_stops,
                workdir,
                args.kill_in_rollback,
                args.tree_share,
            )
            record = LoopRecord(name, settings.kills)
            print(
                f"loop {name}: {TITLES[name]}, {settings.kills} kills (state under {workdir / name})",
                flush=True,
            )
            try:
                RUNNERS[name](upstream, settings, record)
            except LoopAborted as exc:
                record.fail(f"loop aborted: {exc}")
            refused_by_locks = record.ledger.counts("locked") if record.ledger else {}
            if refused_by_locks:
                record.fail(
                    f"answers refused by a git lock: {refused_by_locks}; "
                    f"{(record.ledger.samples.get('rollback') or [''])[0][:300]}"  # type: ignore[union-attr]
                )
            record.seconds = time.monotonic() - record.started
            rows.append(summarize(record))
            print_table(rows[-1])
    if not args.keep and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    rows = run(args)
    seconds = time.monotonic() - started
    print_summary(rows, seconds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": {
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                },
                "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "seconds": round(seconds, 1),
                "loops": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")
    return 1 if any(r["failures"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
