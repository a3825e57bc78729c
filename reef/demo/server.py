"""The demo's own `reef serve`: a child process on a free port, configured to learn.

It runs in its own session (so a Ctrl-C in the terminal reaches the demo, which then stops the
server itself: SIGTERM, then SIGKILL), with the environment cleared of settings that would
override the demo's (a token, an upstream, another state directory).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import httpx

import reef
from reef.config.learner import CANARY_MAX_FRACTION

OVERRIDING_ENV = ("REEF_TOKEN", "REEF_STATE_DIR", "REEF_UPSTREAM_URL", "REEF_UPSTREAM_API_KEY", "REEF_UPSTREAM_MODEL")


class DemoServerError(RuntimeError):
    """The demo's server did not start, or died."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Exact answers are one word (two to four tokens with the end token). Live answers may run to a
# short sentence; the gate's greedy answers need no more than a word, and every token it does
# not generate leaves the one serving core to live traffic.
TRAFFIC_MAX_TOKENS = 16
GATE_MAX_TOKENS = 8
TRAFFIC_TEMPERATURE = 1.0
LEARNING_RATE = 2e-4
# Full weights (`--weights full`): lr 2e-4 scaled by the default 0.02 (4e-6) moved the test
# questions 2 points in 15 minutes on two ranks; 2e-5 moved them as far as LoRA does.
FULL_LEARNING_RATE = 2e-5
# Two optimiser steps a candidate keep a candidate's later steps and the samples that arrive
# while it trains close to the weights being trained.
STEPS_PER_CANDIDATE = 2
# cispo keeps the gradient of the tokens its slightly stale samples already made likelier (ppo's
# clip drops them), and reached +30 points sooner in the learning race.
LOSS = "cispo"
# One request in ten goes to the newest candidate under test, which the gate has not selected, so
# the learner gets near on-policy samples within learner.canary_max_fraction's default.
CANARY = CANARY_MAX_FRACTION
# While the learner waits for samples, the gate keeps at most 4 requests (half a batch) in the
# serving runtime, leaving the rest to the live traffic learning lacks.
GATE_CONCURRENCY = 4
GATE_CONCURRENCY_WHEN = "starved"
# A candidate a step or two from the serving release cannot win on the gate's greedy answers and
# would hold the gate for a minute, so a line goes to the gate 8 candidates (16 steps) past it.
GATE_AFTER_BATCHES = 8
# Near the model's ceiling the gate's 92 greedy answers cannot see the line's last few points,
# so once they stall the line's live scores join the gate's test (split at the canary's bound).
LIVE_SPLIT = CANARY_MAX_FRACTION
# A head looks better than it is on the tasks that chose it, so from the first selection on its
# successors are judged on the half of the tasks that did not.
GATE_HALVES = "after_first"


def demo_settings(
    workdir: Path,
    heldout: Path,
    port: int,
    model_dir: Path | None,
    lr: float = LEARNING_RATE,
    runtime: str = "embedded",
    scorer: str = "reef.demo.tasks:gate_score",
    traffic_max_tokens: int = TRAFFIC_MAX_TOKENS,
    gate_max_tokens: int = GATE_MAX_TOKENS,
    canary: float | None = None,
    loss: str = LOSS,
    gate_concurrency: int | None = GATE_CONCURRENCY,
    gate_concurrency_when: str = GATE_CONCURRENCY_WHEN,
    gate_after_batches: int = GATE_AFTER_BATCHES,
    live_split: float | None = LIVE_SPLIT,
    gate_halves: bool | str = GATE_HALVES,
    weights: str = "lora",
    ranks: int = 1,
) -> dict[str, Any]:
    """serve.yaml for the demo: the embedded model (or vLLM, serving the same model folder the
    trainer trains), short answers, and a learner whose gate runs the held-out tasks through the
    strict verifier (or another task's `scorer`, as bench/learning_race.py does)."""
    embedded: dict[str, Any] = {"default_max_tokens": traffic_max_tokens}
    if model_dir is not None:
        embedded["model_dir"] = str(Path(model_dir).resolve())
    engine = {"vllm": {"default_max_tokens": traffic_max_tokens}} if runtime == "vllm" else {}
    return {
        "host": "127.0.0.1",
        "port": port,
        "state_dir": str((workdir / "state").resolve()),
        "runtime": runtime,
        "log_level": "warning",
        "embedded": embedded,
        **engine,
        "learner": {
            **({"weights": weights, "ranks": ranks} if weights != "lora" or ranks != 1 else {}),
            "sao": {
                "batch_size": 8,
                "steps_per_candidate": STEPS_PER_CANDIDATE,
                "lr": lr,
                "loss": loss,
                **({"full_lr": FULL_LEARNING_RATE} if weights == "full" else {}),
            },
            "gate": {
                "tasks": str(heldout.resolve()),
                "scorer": scorer,
                "max_tokens": gate_max_tokens,
                "temperature": 0,
                "after_batches": gate_after_batches,
                "halves": gate_halves,
                **(
                    {"concurrency": gate_concurrency, "concurrency_when": gate_concurrency_when}
                    if gate_concurrency
                    else {}
                ),
                **({"live_split": live_split} if canary and live_split else {}),
            },
            **({"canary": {"demo": canary}} if canary else {}),
            **canary_bound(canary, live_split),
        },
    }


def canary_bound(canary: float | None, live_split: float | None) -> dict[str, float]:
    """learner.canary_max_fraction for a fraction asked above its default (`--canary`, a race's
    arm): raised to it, knowingly; {} when the default holds."""
    asked = max(canary or 0.0, live_split or 0.0)
    return {"canary_max_fraction": asked} if asked > CANARY_MAX_FRACTION else {}


class DemoServer:
    def __init__(
        self, config_path: Path, port: int, log_path: Path, pythonpath: Sequence[str] = (), checkout: Path | None = None
    ) -> None:
        self.config_path = config_path
        self.port = port
        self.log_path = log_path
        self.pythonpath = tuple(pythonpath)  # more import roots for the server (a bench's scorer module)
        self.checkout = checkout  # the source tree whose `reef` the server runs (a bench's baseline); None: this one
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 900.0) -> None:
        """Start and wait for /healthz (the first start converts SmolLM2's weights, ~1 minute)."""
        env = {k: v for k, v in os.environ.items() if k not in OVERRIDING_ENV}
        package_root = str(self.checkout.resolve() if self.checkout else Path(reef.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, *self.pythonpath, env.get("PYTHONPATH")) if p)
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "reef", "serve", "-c", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.config_path.parent,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise DemoServerError(f"reef serve did not become healthy in {timeout:.0f}s; see {self.log_path}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise DemoServerError(f"reef serve exited with {self.process.returncode}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
