"""`reef serve --workers N`: N processes behind one port on one machine.

The supervisor (the `reef serve` process itself) binds the listening socket once and starts N
workers, each a `reef serve` with the same arguments that serves on the inherited socket
(`--worker-of INDEX:FD`); the kernel hands each new connection to one of them. A worker that
dies is started again after a second; SIGTERM or SIGINT to the supervisor stops every worker
the way SIGTERM stops one `reef serve` (running requests finish, up to `shutdown_timeout`).

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
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from reef.config import ServeConfig
from reef.core.errors import InvalidInput

RESTART_DELAY_S = 1.0
QUICK_FAILURES = 5  # a worker that exits this many times in a row within STARTUP_S of starting: give up
STARTUP_S = 30.0


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


def worker_socket(fd: int) -> socket.socket:
    return socket.socket(fileno=fd)  # family and type read from the descriptor


def supervise(config: ServeConfig, workers: int, say: Callable[[str], None]) -> int:
    """Bind, start the workers, keep them running until SIGTERM or SIGINT; the exit status."""
    where = prepare_state(config)
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        raise InvalidInput(f"cannot listen on {config.host}:{config.port}: {exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    command = [sys.executable, "-m", "reef", *sys.argv[1:]]  # the same `reef serve` arguments
    stopping = False

    def start(index: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*command, "--worker-of", f"{index}:{sock.fileno()}"], pass_fds=(sock.fileno(),))

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    say(f"{workers} workers on http://{config.host}:{config.port} (supervisor pid {os.getpid()}; {where})")
    children = {i: start(i) for i in range(workers)}
    started = {i: time.monotonic() for i in children}
    quick = dict.fromkeys(children, 0)
    status = 0
    try:
        while not stopping:
            time.sleep(0.2)
            for index, child in list(children.items()):
                if child.poll() is None or stopping:
                    continue
                quick[index] = quick[index] + 1 if time.monotonic() - started[index] < STARTUP_S else 1
                if quick[index] >= QUICK_FAILURES:
                    say(f"worker {index} exited {quick[index]} times in a row soon after starting "
                        f"(last status {child.returncode}); stopping")
                    stopping, status = True, 1
                    break
                say(f"worker {index} (pid {child.pid}) exited with {child.returncode}; starting it again")
                time.sleep(RESTART_DELAY_S)
                children[index], started[index] = start(index), time.monotonic()
    finally:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + config.shutdown_timeout + 10
        for child in children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        sock.close()
    return status
