"""The `reef serve --workers N` supervisor (issue 63, item 2), with real processes on real ports.

A worker says READY on a pipe once it serves; the supervisor counts only exits before that as
failures to start. A ready worker SIGKILLed again and again is started again each time and the
supervisor never stops the others; a worker that fails before it is ready is started again after
a delay that doubles (1, 2, 4 ... s) while the others serve; the supervisor gives up (exit 1) only
when every worker's last five starts ended before it was ready. A SIGKILLed supervisor takes its
workers with it (the parent-death signal, or the polling fallback off Linux), so a new
`reef serve --workers 2` on the same port starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from reef.serve.workers import GIVE_UP_AFTER
from tests.helpers.reef_server import ROOT, free_port
from tests.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the workers")

WORKERS = 2


def wait_for(what: str, condition: Callable[[], Any], timeout: float, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def worker_pids(supervisor_pid: int) -> dict[int, int]:
    """The supervisor's live workers by index, read from /proc (`--worker-of INDEX:...`)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # it exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if fields[0] != "Z" and int(fields[1]) == supervisor_pid and b"--worker-of" in argv:
            found[int(argv[argv.index(b"--worker-of") + 1].split(b":")[0])] = int(entry.name)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


class Supervisor:
    """`reef serve --workers N` in front of the scripted upstream, its log in a file."""

    def __init__(
        self, root: Path, upstream: ScriptedUpstream, port: int | None = None, extra: dict[str, Any] | None = None
    ) -> None:
        self.root = root
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        settings = {
            "state_dir": str(root / "state"),
            "port": self.port,
            "log_level": "warning",
            "upstream": {"url": upstream.base_url, "model": "p", "timeout": 10},
            **(extra or {}),
        }
        config = root / f"reef-{self.port}.yaml"
        config.write_text(yaml.safe_dump(settings))
        self.log = root / f"supervisor-{time.monotonic_ns()}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        for name in ("REEF_TOKEN", "REEF_UPSTREAM_URL", "REEF_UPSTREAM_API_KEY", "REEF_UPSTREAM_MODEL"):
            env.pop(name, None)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "reef", "serve", "-c", str(config), "--workers", str(WORKERS)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=root,
            )
        self.seen_pids: set[int] = set()

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def workers(self) -> dict[int, int]:
        pids = worker_pids(self.process.pid)
        self.seen_pids.update(pids.values())
        return pids

    def answering_pid(self) -> int | None:
        """The pid of the worker that answers a new connection."""
        with httpx.Client(base_url=self.url, timeout=5) as client:
            return int(client.get("/reef/status").json()["learning"]["front_end"].rsplit(" ", 1)[1])

    def wait_answering(self, pid: int, timeout: float = 60.0) -> None:
        """Until `pid` answers (it is ready): new connections until the kernel hands one to it."""

        def answered() -> bool:
            assert self.process.poll() is None, f"the supervisor exited with {self.process.returncode}\n{self.logs()}"
            return self.answering_pid() == pid

        wait_for(f"worker pid {pid} to answer", answered, timeout)

    def new_worker(self, index: int, not_pid: int, timeout: float = 60.0) -> int:
        def started() -> int | None:
            assert self.process.poll() is None, f"the supervisor exited with {self.process.returncode}\n{self.logs()}"
            pid = self.workers().get(index)
            return pid if pid not in (None, not_pid) else None

        return wait_for(f"worker {index} to be started again", started, timeout, step=0.01)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in self.seen_pids:  # workers a dead supervisor left behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def supervisors(tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    started: list[Supervisor] = []
    with ScriptedUpstream(record=False) as upstream:

        def start(**kwargs: Any) -> Supervisor:
            started.append(Supervisor(tmp_path, upstream, **kwargs))
            return started[-1]

        try:
            yield start
        finally:
            for supervisor in started:
                supervisor.stop()


def both_ready(supervisor: Supervisor) -> dict[int, int]:
    pids = wait_for("both workers to start", lambda: len(supervisor.workers()) == WORKERS and supervisor.workers(), 60)
    for pid in pids.values():
        supervisor.wait_answering(pid)
    return pids


def test_a_ready_worker_killed_six_times_quickly_is_started_again_each_time(
    supervisors: Callable[..., Supervisor],
) -> None:
    supervisor = supervisors()
    pids = both_ready(supervisor)
    for kill in range(6):
        os.kill(pids[0], signal.SIGKILL)  # as soon as it serves: well within 30 s of its start
        pids[0] = supervisor.new_worker(0, pids[0])
        supervisor.wait_answering(pids[0])
        assert supervisor.workers()[1] == pids[1], f"kill {kill + 1}: the healthy worker was stopped"
    assert supervisor.process.poll() is None
    assert "before it was ready" not in supervisor.logs()


def test_a_worker_failing_before_ready_is_backed_off_while_the_other_serves(
    supervisors: Callable[..., Supervisor],
) -> None:
    supervisor = supervisors()
    pids = both_ready(supervisor)
    gaps = []
    for _ in range(1 + GIVE_UP_AFTER):  # past the give-up count, while worker 1 serves
        os.kill(pids[0], signal.SIGKILL)  # the first one ready, then each before it is ready
        killed = time.monotonic()
        pids[0] = supervisor.new_worker(0, pids[0])
        gaps.append(time.monotonic() - killed)
        assert supervisor.answering_pid() == pids[1]  # the other serves meanwhile
    print("restart delays after each kill:", [f"{g:.2f}" for g in gaps])
    assert gaps[0] < 3.0  # a ready worker: a second
    for before, after in pairwise(gaps[1:]):
        assert after > 1.6 * before, gaps  # doubling: 1, 2, 4, 8, 16 s
    supervisor.wait_answering(pids[0])  # left alone, it starts and serves; the supervisor never gave up
    assert supervisor.workers()[1] == pids[1]
    assert f"before it was ready ({GIVE_UP_AFTER} in a row); starting it again in 16 s" in supervisor.logs()


def test_the_supervisor_gives_up_only_when_no_worker_can_become_ready(
    supervisors: Callable[..., Supervisor], tmp_path: Path
) -> None:
    # the gate's tasks file is read by each worker before it serves (not by the supervisor)
    gate = {"tasks": str(tmp_path / "missing.jsonl"), "scorer": "tests.test_workers_state_dir:exact_answer"}
    supervisor = supervisors(extra={"learner": {"gate": gate}})
    started = time.monotonic()
    assert supervisor.process.wait(timeout=120) == 1, supervisor.logs()
    took = time.monotonic() - started
    logs = supervisor.logs()
    assert f"every worker exited {GIVE_UP_AFTER} times in a row before it was ready" in logs, logs
    for delay in ("1", "2", "4", "8"):
        assert f"in a row); starting it again in {delay} s" in logs, logs
    assert took > 1 + 2 + 4 + 8, took  # it backed off before giving up
    assert wait_for("no worker left", lambda: not any(alive(pid) for pid in supervisor.seen_pids), 5)


def test_a_killed_supervisor_takes_its_workers_and_a_new_one_gets_the_port(
    supervisors: Callable[..., Supervisor],
) -> None:
    first = supervisors()
    pids = both_ready(first)
    os.kill(first.process.pid, signal.SIGKILL)
    first.process.wait(timeout=10)
    killed = time.monotonic()
    wait_for("the workers to stop", lambda: not any(alive(pid) for pid in pids.values()), 10)
    print(f"workers gone {time.monotonic() - killed:.2f} s after their supervisor")
    second = supervisors(port=first.port)
    again = both_ready(second)
    assert set(again.values()).isdisjoint(pids.values())
    assert second.process.poll() is None, second.logs()


def test_a_worker_whose_supervisor_is_gone_before_it_starts_stops_at_once() -> None:
    """The race the parent-death signal leaves: the supervisor died before the worker set it."""
    program = "from reef.serve.worker import become_worker; become_worker('0:0:1:1'); print('serving')"
    done = subprocess.run(
        [sys.executable, "-c", program],  # pid 1 is not its parent
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1 and "serving" not in done.stdout
    assert "the supervisor (pid 1) is gone; worker 0 stops" in done.stderr


ORPHAN = """
import os, pathlib, subprocess, sys, threading, time
from reef.serve import worker
role, watching = sys.argv[1], pathlib.Path(sys.argv[2])
if role == "middle":
    subprocess.Popen([sys.executable, "-c", sys.argv[3], "child", sys.argv[2]])
else:
    worker.PARENT_POLL_S = 0.05
    threading.Thread(target=worker._stop_when_orphaned, args=(os.getppid(),), daemon=True).start()
    watching.write_text(str(os.getpid()))
time.sleep(60)
"""


def test_without_a_parent_death_signal_a_worker_polls_and_stops_when_orphaned(tmp_path: Path) -> None:
    """The fallback off Linux, run here: the watch thread alone stops an orphaned worker."""
    watching = tmp_path / "watching"
    middle = subprocess.Popen(
        [sys.executable, "-c", ORPHAN, "middle", str(watching), ORPHAN], env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    child = 0
    try:
        child = int(wait_for("the child to watch its parent", lambda: watching.exists() and watching.read_text(), 30))
        os.kill(middle.pid, signal.SIGKILL)
        middle.wait(timeout=10)
        wait_for("the orphan to stop", lambda: not alive(child), 5)
    finally:
        if middle.poll() is None:
            middle.kill()
        if child and alive(child):
            os.kill(child, signal.SIGKILL)
