"""A newcomer's first minute with `reef serve`: the embedded runtime's warm start, and the lines
said once the server is ready (where the dashboard is, a first request, how to score it).

The warm start pays what the first request of the default scenario would otherwise pay before
the server says it is ready: the scenario's creation, its learner's start (the training process
loads the model) and the first pass through the model, which is slower than the ones after it.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from reef.client import DEFAULT_URL
from reef.config import ServeConfig
from reef.core.chat import ChatRequest, Message
from reef.core.errors import ReefError
from reef.runtimes.base import Runtime
from reef.serve.scenarios import ScenarioDirectory

if TYPE_CHECKING:
    from reef.serve.app import ReefApp

log = logging.getLogger("reef.serve")

DEFAULT_SCENARIO = "default"
FIRST_QUESTION = "What is the capital of France?"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def when_ready(
    config: ServeConfig, runtime: Runtime, say: Callable[[str], None]
) -> Callable[[ReefApp], Awaitable[None]]:
    """`create_app`'s `on_ready` for `reef serve`: the warm start, then the first steps said."""

    async def ready(app: ReefApp) -> None:
        if wants_warm_start(config, runtime):
            seconds = await warm_start(app.scenarios, runtime)
            if seconds is not None:
                say(
                    f"warm start: the default scenario ready (with its learner, when learning is on), first token in {seconds:.1f} s"
                )
        for line in ready_lines(config, runtime):
            say(line)

    return ready


def wants_warm_start(config: ServeConfig, runtime: Runtime) -> bool:
    """Only the embedded model runs here (vLLM and SGLang are servers of their own, warm already)."""
    return runtime.name == "embedded" and config.embedded.warm_start


async def warm_start(scenarios: ScenarioDirectory, runtime: Runtime) -> float | None:
    """Admit one token of the default scenario, as its first request would; the seconds it took,
    or None when it failed (logged: the server serves on, its first request pays instead)."""
    started = time.monotonic()
    request = ChatRequest(
        model="warm-start", messages=(Message("user", "Hi"),), dialect="openai", max_tokens=1, temperature=0
    )
    try:
        async with scenarios.admit(DEFAULT_SCENARIO) as release:
            async for _ in runtime.generate(request, release):
                pass
    except ReefError as exc:
        log.warning("warm start failed (the first request loads what it needs instead): %s", exc)
        return None
    except Exception:  # a warm-up is never worth not serving
        log.exception("warm start failed (the first request loads what it needs instead)")
        return None
    return time.monotonic() - started


def ready_lines(config: ServeConfig, runtime: Runtime) -> list[str]:
    """Where the dashboard is, a first request as a curl line, and how to score its receipt."""
    base = f"http://{_reachable_host(config.host)}:{config.port}"
    body = {
        "model": (runtime.served_models() or ["default"])[0],
        "temperature": 0,
        "messages": [{"role": "user", "content": FIRST_QUESTION}],
    }
    auth = ' -H "authorization: Bearer $REEF_TOKEN"' if config.tokens else ""
    url = "" if base == DEFAULT_URL else f" --url {base}"
    return [
        f"dashboard: {base}/ui",
        f"first request: curl -s {base}/v1/chat/completions -H 'content-type: application/json'{auth} -D - "
        f"-d {shlex.quote(json.dumps(body))}",
        f"score it: {_reef_command()} report{url} <x-reef-agent-record-id from its headers> --score 1 "
        f"--feedback right (or POST {base}/reef/report); docs/http.md has the rest",
    ]


def _reachable_host(host: str) -> str:
    if host in WILDCARD_HOSTS:
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _reef_command() -> str:
    """`reef` when that is on the PATH as this program, else the path this program was started by."""
    program = Path(sys.argv[0])
    if program.name != "reef":
        return f"{sys.executable} -m reef"  # started as python -m reef
    on_path = shutil.which("reef")
    if on_path and os.path.realpath(on_path) == os.path.realpath(program):
        return "reef"
    return str(program)
