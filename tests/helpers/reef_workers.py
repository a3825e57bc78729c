"""A real `reef serve --workers N` (the supervisor and its workers) on a free port, for tests and
benchmarks that kill parts of it.

    workers = ReefWorkers(tmp_path, settings, workers=3).start()
    workers.worker_pids()   # the live workers of this deployment, by pid
    workers.pid_serving()   # which worker answered a fresh connection
    workers.stop()          # SIGTERM to the supervisor; workers it left behind are killed by pid

The workers are found by their command line (`--worker-of` and this deployment's own config
file), so workers that outlived a killed supervisor are found too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.helpers.reef_server import ROOT, free_port


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat")
    try:
        return state.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, just unreaped
    except (OSError, IndexError):
        return False


class ReefWorkers:
    def __init__(
        self,
        workdir: Path,
        settings: dict[str, Any],
        workers: int = 3,
        port: int | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        self.workdir = Path(workdir)
        self.workers = workers
        self.port = port or free_port()
        self.settings = {
            "state_dir": str(self.workdir / "state"),
            "port": self.port,
            "log_level": "warning",
            **settings,
        }
        self.config = self.workdir / f"workers-{self.port}.yaml"
        self.log_path = self.workdir / f"workers-{self.port}.log"
        self.startup_timeout = startup_timeout
        self.supervisor: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> ReefWorkers:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(yaml.safe_dump(self.settings))
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        for name in (
            "REEF_TOKEN",
            "REEF_UPSTREAM_URL",
            "REEF_UPSTREAM_API_KEY",
            "REEF_UPSTREAM_MODEL",
        ):
            env.pop(name, None)
        with self.log_path.open("ab") as log:
            self.supervisor = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "reef",
                    "serve",
                    "-c",
                    str(self.config),
                    "--workers",
                    str(self.workers),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
            )
        if wait:
            self.wait_healthy()
        return self

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if not self.supervisor_alive:
                raise RuntimeError(f"the supervisor exited with {self.supervisor.returncode}:\n{self.logs()}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"reef serve --workers did not become healthy in {self.startup_timeout}s:\n{self.logs()}")

    @property
    def supervisor_alive(self) -> bool:
        return self.supervisor is not None and self.supervisor.poll() is None

    def logs(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def worker_pids(self) -> list[int]:
        """Live worker processes started from this deployment's config, whoever their parent is
        now (a worker's own child between fork and exec has the worker's command line: skipped)."""
        mine = str(self.config)
        matching = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                pid = int(entry.name)
                args = _cmdline(pid)
                if "--worker-of" in args and mine in args and _alive(pid):
                    matching[pid] = _parent(pid)
        return sorted(pid for pid, parent in matching.items() if parent not in matching)

    def pid_serving(self, timeout: float = 1.0) -> int | None:
        """The pid of the worker that answers a new connection's `/reef/status`, or None."""
        try:
            name = httpx.get(f"{self.url}/reef/status", timeout=timeout).json()["learning"]["front_end"]
            return int(name.rsplit(" ", 1)[1])
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            return None

    def kill_supervisor(self) -> None:
        if self.supervisor is not None and self.supervisor_alive:
            self.supervisor.send_signal(signal.SIGKILL)
            self.supervisor.wait(timeout=30)

    def kill_workers(self) -> list[int]:
        """SIGKILL every worker of this deployment still alive (e.g. left behind by a killed
        supervisor); the pids killed."""
        killed = []
        for pid in self.worker_pids():
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in killed) and time.monotonic() < deadline:
            time.sleep(0.02)
        return killed

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM to the supervisor, then SIGKILL to whatever of this deployment is left; the
        supervisor's exit status (None if it had to be killed)."""
        status = None
        if self.supervisor is not None:
            if self.supervisor_alive:
                self.supervisor.send_signal(signal.SIGTERM)
            try:
                status = self.supervisor.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.supervisor.kill()
                self.supervisor.wait()
        self.kill_workers()
        return status
