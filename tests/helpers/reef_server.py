"""A real `reef serve` in a child process on a free port, for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ReefServer:
    """`with ReefServer(tmp_path, settings) as reef:` then `reef.url`, `reef.base_url`."""

    def __init__(
        self,
        workdir: Path,
        settings: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        startup_timeout: float = 90.0,
    ) -> None:
        self.workdir = Path(workdir)
        self.port = free_port()
        self.settings = {
            "state_dir": str(self.workdir / "state"),
            "port": self.port,
            "log_level": "warning",
            **(settings or {}),
        }
        # no warm start (the default scenario and its learner made before "ready") unless a test asks
        self.settings["embedded"] = {"warm_start": False, **(self.settings.get("embedded") or {})}
        self.env = env or {}
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / f"reef-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def state_dir(self) -> Path:
        return Path(self.settings["state_dir"])

    def start(self) -> ReefServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / f"serve-{self.port}.yaml"
        config.write_text(yaml.safe_dump(self.settings))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **self.env}
        for name in ("REEF_TOKEN", "REEF_UPSTREAM_URL", "REEF_UPSTREAM_API_KEY", "REEF_UPSTREAM_MODEL"):
            if name not in self.env:
                env.pop(name, None)  # only what the test sets
        self.log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "reef", "serve", "-c", str(config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.workdir,
        )
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"reef serve exited with {self.process.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"reef serve did not become healthy in {self.startup_timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        if getattr(self, "log", None):
            self.log.close()

    def __enter__(self) -> ReefServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
