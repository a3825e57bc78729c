"""Launching the training process as a torchrun job of N ranks (`learner.ranks`, `learner.nodes`).

The worker (`reef.grow.worker`) listens on a loopback port with a fresh authkey; torchrun starts
`reef.grow.rank_main` on each rank, and rank 0 connects back. What comes back is the connection
and a handle on torchrun that answers as a `multiprocessing.Process` does (`join`, `is_alive`,
`kill`, `exitcode`, `pid`), so the worker supervises it as it does its one-process child.
torchrun runs in a session of its own (its group is killed as one) and gets SIGKILL when Reef
dies; each rank gets SIGTERM when torchrun dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

from reef.grow.rank_main import ADDRESS_ENV, AUTHKEY_ENV, PR_SET_PDEATHSIG


@dataclass(frozen=True)
class RankLayout:
    """How many ranks where: `ranks` on this machine (one per GPU), on each of `nodes` machines
    that meet at `rendezvous` (host:port of this machine, which runs rank 0)."""

    ranks: int = 1
    nodes: int = 1
    rendezvous: str | None = None

    def torchrun_args(self) -> list[str]:
        args = ["--nproc-per-node", str(self.ranks), "--max-restarts", "0"]
        if self.nodes == 1:
            return [*args, "--standalone"]
        if not self.rendezvous:
            raise ValueError("learner.nodes > 1 needs learner.rendezvous, host:port of this machine")
        host, port = self.rendezvous.rsplit(":", 1)
        return [*args, "--nnodes", str(self.nodes), "--node-rank", "0", "--master-addr", host, "--master-port", port]


class RankJob:
    """torchrun, seen as a `multiprocessing.Process`."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # torchrun's group; each rank follows it (death signal)


def rank_command(
    model_dir: Path, layout: RankLayout, threads: int, placement: tuple[str, str, str | None]
) -> list[str]:
    """The torchrun command line of this machine's ranks (every other node runs the same with its
    own `--node-rank`: docs/deploy.md)."""
    device, dtype, engine_dtype = placement
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *layout.torchrun_args(),
        "-m",
        "reef.grow.rank_main",
        "--model-dir",
        str(model_dir),
        "--threads",
        str(threads),
        "--device",
        device,
        "--dtype",
        dtype,
        "--engine-dtype",
        engine_dtype or "",
    ]


class Launch:
    """torchrun started, rank 0 not yet connected. Construct it on the event loop's thread: the
    kernel's death signal follows the thread that started torchrun, which must outlive it (not a
    pool thread); then `connection()` (blocking: in a thread) waits for rank 0."""

    def __init__(self, command: list[str], threads: int) -> None:
        self.authkey = secrets.token_bytes(32)
        self.listener = Listener(("127.0.0.1", 0), authkey=self.authkey)
        host, port = self.listener.address
        env = {
            **os.environ,
            ADDRESS_ENV: f"{host}:{port}",
            AUTHKEY_ENV: self.authkey.hex(),
            "OMP_NUM_THREADS": str(max(1, threads)),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        try:
            popen = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_death_signal()
            )
        except OSError:
            self.listener.close()
            raise
        self.job = RankJob(popen)

    def connection(self) -> Connection:
        """Rank 0's connection, once it has connected; EOFError when torchrun ends before that."""
        accepted: list[Connection] = []
        waiter = threading.Thread(target=lambda: accepted.append(self.listener.accept()), daemon=True)
        waiter.start()
        try:
            while waiter.is_alive() and self.job.is_alive():
                waiter.join(0.1)
            if not waiter.is_alive() and accepted:
                return accepted[0]
            if waiter.is_alive():  # torchrun ended first: wake the accept with a connection of our own
                with contextlib.suppress(OSError, EOFError):
                    Client(self.listener.address, authkey=self.authkey).close()
                waiter.join(5)
            for conn in accepted:
                conn.close()
            raise EOFError(f"torchrun exited with {self.job.exitcode} before rank 0 connected")
        finally:
            self.listener.close()


def _death_signal() -> object:
    """A preexec function that asks the kernel for SIGKILL when Reef dies (Linux; elsewhere
    torchrun outlives a killed Reef until its ranks' next job fails to arrive)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork: the child only calls it
    return lambda: prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


__all__ = ["Launch", "RankJob", "RankLayout", "rank_command"]
