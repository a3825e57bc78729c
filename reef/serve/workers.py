"""`reef serve --workers N`: N processes behind one port on one machine.

The supervisor (the `reef serve` process itself) binds the listening socket once and starts N
workers, each a `reef serve` with the same arguments that serves on the inherited socket
(`--worker-of`, reef/serve/worker.py); the kernel hands each new connection to one of them.
A worker says READY on a pipe once it serves. One that exits after that is started again after
a second; one that exits before it (a failure to start) is started again after a backoff that
doubles each time, 1 s up to 30 s, so a sick worker never stops the healthy ones. The
supervisor gives up (stops all, exits 1) only when every worker's last five starts all ended
before it was ready: then none serves and none can. SIGTERM or SIGINT to the supervisor stops
every worker the way SIGTERM stops one `reef serve` (running requests finish, up to
`shutdown_timeout`); a supervisor that dies without stopping them (SIGKILL) takes them with it,
by the parent-death signal each worker sets, so a new supervisor gets the port.

The workers share the state by the rules of several front ends (docs/deploy.md): each follows
the head the others publish, and each scenario's learner runs on the one worker holding its lease.
Two ways, after the store:

- SQLite (the default): every worker serves the one state directory (`shared_state_dir`): the
  SQLite store in WAL mode, the JSONL commit logs under their `flock`, the one artifact
  repository, learner leases as file locks (`reef/commit/file_leases.py`). The supervisor opens
  the state directory once before starting them (recovery runs alone, a new SQLite file is made
  in WAL mode once); a worker started again opens it while the others write, which is safe.
- PostgreSQL: records, reports and the commit log in the database, leases as advisory locks.
  Each worker has its own state directory, `<state_dir>/workers/<index>`, and the workers share
  release contents through the artifact remote: `artifacts.remote` if set, else a bare
  repository at `<state_dir>/artifacts-remote.git` that the supervisor creates.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from reef.config import ServeConfig
from reef.core.errors import InvalidInput
from reef.serve.worker import READY, WorkerOf

POLL_S = 0.2
RESTART_DELAY_S = 1.0  # after an exit once ready, and the first step of the backoff
MAX_RESTART_DELAY_S = 30.0  # the backoff of a worker that keeps failing before it is ready: 1, 2, 4 ... 30 s
GIVE_UP_AFTER = 5  # when every worker's last this-many starts ended before it was ready: stop, exit 1


def on_postgres(config: ServeConfig) -> bool:
    return config.store.startswith(("postgresql://", "postgres://"))


def shared_remote(config: ServeConfig) -> str:
    return config.artifacts.remote or str(config.state_dir / "artifacts-remote.git")


def worker_config(config: ServeConfig, index: int) -> ServeConfig:
    """A worker's settings. SQLite: the one state directory, shared. PostgreSQL: its own state
    directory, the shared artifact remote."""
    if not on_postgres(config):
        return config.model_copy(update={"shared_state_dir": True})
    artifacts = config.artifacts.model_copy(update={"remote": shared_remote(config)})
    return config.model_copy(update={"state_dir": config.state_dir / "workers" / str(index), "artifacts": artifacts})


def prepare_state(config: ServeConfig) -> str:
    """Before any worker starts: open the shared state directory once (SQLite), or create the
    artifact remote (PostgreSQL, none set). What the workers' state is, for the first line."""
    if not on_postgres(config):
        from reef.commit.state import ReefState

        ReefState.open(config.state_dir, artifacts_remote=config.artifacts.remote, shared=True).close()
        return f"state {config.state_dir}, shared"
    remote = shared_remote(config)
    if config.artifacts.remote is None and not Path(remote).exists():
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "--bare", "--quiet", remote], check=True)
    return f"state {config.state_dir}/workers/*, artifacts {remote}"


class Slot:
    """One worker's place: its process (None while waiting to start again), the pipe it says
    READY on, whether it did, and how many of its starts in a row ended before it was ready."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_pipe = -1
        self.ready = False
        self.failures = 0
        self.start_at = 0.0  # while process is None: when to start it again

    def start(self, command: list[str], sock: socket.socket) -> None:
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        worker = WorkerOf(self.index, sock.fileno(), write_end, os.getpid())
        try:
            self.process = subprocess.Popen(
                [*command, "--worker-of", worker.argument()], pass_fds=(sock.fileno(), write_end)
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)  # the worker's now: EOF here once it exits
        self.ready_pipe, self.ready = read_end, False

    def heard_ready(self) -> bool:
        """Read the pipe: True when the worker said READY just now."""
        if self.ready or self.ready_pipe < 0:
            return False
        try:
            said = os.read(self.ready_pipe, len(READY))
        except BlockingIOError:
            return False
        self.close_pipe()
        self.ready = said == READY
        if self.ready:
            self.failures = 0
        return self.ready

    def ended(self, now: float) -> float:
        """The process exited: count it if it was never ready; the delay before starting it again."""
        self.heard_ready()  # it may have said READY since the last look
        self.close_pipe()
        self.process = None
        if self.ready:
            delay = RESTART_DELAY_S
        else:
            self.failures += 1
            delay = min(RESTART_DELAY_S * 2 ** (self.failures - 1), MAX_RESTART_DELAY_S)
        self.start_at = now + delay
        return delay

    def close_pipe(self) -> None:
        if self.ready_pipe >= 0:
            os.close(self.ready_pipe)
            self.ready_pipe = -1


def listen(config: ServeConfig) -> socket.socket:
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"cannot listen on {config.host}:{config.port}: {exc}") from None
    sock.listen(2048)
    return sock


def supervise(config: ServeConfig, workers: int, say: Callable[[str], None]) -> int:
    """Bind, start the workers, keep them running until SIGTERM or SIGINT; the exit status."""
    where = prepare_state(config)
    sock = listen(config)
    command = [sys.executable, "-m", "reef", *sys.argv[1:]]  # the same `reef serve` arguments
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    say(f"{workers} workers on http://{config.host}:{config.port} (supervisor pid {os.getpid()}; {where})")
    slots = [Slot(i) for i in range(workers)]
    status = 0
    try:
        for slot in slots:
            slot.start(command, sock)
        while not stopping:
            listening = [s.ready_pipe for s in slots if s.ready_pipe >= 0]
            select.select(listening, [], [], POLL_S)
            if not stopping and tend(slots, command, sock, say):
                stopping, status = True, 1
    finally:
        stop_all(slots, config.shutdown_timeout + 10)
        sock.close()
    return status


def tend(slots: list[Slot], command: list[str], sock: socket.socket, say: Callable[[str], None]) -> bool:
    """One look at every worker: note who is ready, schedule who exited, start who is due.
    True when the supervisor should give up: no worker can become ready."""
    now = time.monotonic()
    for slot in slots:
        if slot.process is None:
            if now >= slot.start_at:
                slot.start(command, sock)
            continue
        if slot.heard_ready():
            say(f"worker {slot.index} (pid {slot.process.pid}) ready")
        if slot.process.poll() is None:
            continue
        pid, code = slot.process.pid, slot.process.returncode
        delay = slot.ended(now)
        if all(s.failures >= GIVE_UP_AFTER for s in slots):
            say(
                f"every worker exited {GIVE_UP_AFTER} times in a row before it was ready "
                f"(worker {slot.index}'s last status {code}); stopping"
            )
            return True
        before = "" if slot.ready else f" before it was ready ({slot.failures} in a row)"
        say(f"worker {slot.index} (pid {pid}) exited with {code}{before}; starting it again in {delay:g} s")
    return False


def stop_all(slots: list[Slot], timeout: float) -> None:
    """SIGTERM to every worker; SIGKILL to those still running after `timeout`."""
    running = [s.process for s in slots if s.process is not None and s.process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in running:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for slot in slots:
        slot.close_pipe()
