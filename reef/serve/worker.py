"""One worker of `reef serve --workers N`, as the supervisor starts it (`--worker-of`).

It serves on the listening socket it inherited, tells the supervisor once it serves (a line on a
pipe the supervisor reads: the supervisor counts only exits before that line as failures to
start), and dies with the supervisor: on Linux the kernel sends it SIGTERM when the supervisor
dies (`prctl(PR_SET_PDEATHSIG)`), elsewhere a thread polls its parent. SIGTERM stops a worker as
it stops one `reef serve`: it closes the listening socket at once, so a new supervisor gets the
port, and running requests finish.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

import uvicorn

from reef.core.errors import InvalidInput

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 0.5  # without a parent-death signal: how often a worker checks its supervisor lives
READY = b"ready\n"


@dataclass(frozen=True)
class WorkerOf:
    """`--worker-of INDEX:SOCKET_FD:READY_FD:SUPERVISOR_PID`."""

    index: int
    socket_fd: int
    ready_fd: int
    supervisor_pid: int

    @classmethod
    def parse(cls, text: str) -> WorkerOf:
        try:
            index, socket_fd, ready_fd, supervisor_pid = (int(part) for part in text.split(":"))
        except ValueError:
            raise InvalidInput(f"--worker-of takes INDEX:SOCKET_FD:READY_FD:SUPERVISOR_PID, got {text!r}") from None
        return cls(index, socket_fd, ready_fd, supervisor_pid)

    def argument(self) -> str:
        return f"{self.index}:{self.socket_fd}:{self.ready_fd}:{self.supervisor_pid}"

    def listening_socket(self) -> socket.socket:
        return socket.socket(fileno=self.socket_fd)  # family and type read from the descriptor


def become_worker(text: str) -> WorkerOf:
    """Parse `--worker-of` and die with the supervisor from here on (or now, if it is gone)."""
    worker = WorkerOf.parse(text)
    os.set_inheritable(worker.ready_fd, False)  # not for the worker's own children (git, an engine)
    if not set_parent_death_signal(signal.SIGTERM):
        threading.Thread(
            target=_stop_when_orphaned, args=(worker.supervisor_pid,), daemon=True, name="reef-supervisor-watch"
        ).start()
    if os.getppid() != worker.supervisor_pid:  # it died before the signal was set: nothing will send it
        sys.exit(f"reef: the supervisor (pid {worker.supervisor_pid}) is gone; worker {worker.index} stops")
    return worker


def set_parent_death_signal(signum: int) -> bool:
    """Linux: the kernel sends `signum` to this process when its parent dies. False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stop_when_orphaned(supervisor_pid: int) -> None:
    while os.getppid() == supervisor_pid:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)


class WorkerServer(uvicorn.Server):
    """uvicorn's server that writes READY to the supervisor's pipe once it serves: after the app's
    startup (runtime, scenarios, learner, follower) and once it listens on the inherited socket."""

    def __init__(self, config: uvicorn.Config, ready_fd: int) -> None:
        super().__init__(config)
        self.ready_fd = ready_fd

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.ready_fd >= 0:
            try:
                os.write(self.ready_fd, READY)
            except OSError:  # the supervisor is gone; its death signal stops this worker
                pass
            os.close(self.ready_fd)
            self.ready_fd = -1
