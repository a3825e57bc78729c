"""An inference engine's server as a child process on a fixed loopback port, for the engine
contract tests and `bench/engine_contract.py`: started from a command, waited for on its health
route, killed with SIGKILL and started again on the same port, which is what an engine crash
and its restart look like to a Reef attached to it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

import httpx


class EngineProcess:
    """`with EngineProcess([...], port, log_path=...) as engine:` then `engine.url`,
    `engine.kill()`, `engine.start()` (again)."""

    def __init__(
        self,
        command: Sequence[str],
        port: int,
        *,
        log_path: Path,
        health: str = "/health",
        env: dict[str, str] | None = None,
        startup_timeout: float = 600.0,
    ) -> None:
        self.command = list(command)
        self.port = port
        self.log_path = Path(log_path)
        self.health = health
        self.env = env or {}
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> EngineProcess:
        """Start it in a process group of its own and wait until its health route answers 200."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- starting {' '.join(self.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        self.starts += 1
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.command[:3]} exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}{self.health}", timeout=30).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.command[:3]} not healthy in {self.startup_timeout:.0f}s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the whole group (an engine's workers too), as a crash would end it."""
        self._signal(signal.SIGKILL, grace=30)

    def stop(self) -> None:
        self._signal(signal.SIGTERM, grace=20)
        self._signal(signal.SIGKILL, grace=10)

    def _signal(self, sig: int, grace: float) -> None:
        process = self.process
        if process is None:
            return
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> EngineProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
