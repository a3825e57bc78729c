"""What Reef's inference-engine runtimes (vLLM, SGLang) share: the 503 an engine that is down
earns, the LoRA adapter inside a release's content, the message inside an engine's error body,
and the load of an adapter that leaves nothing behind when it fails.

Both engines read adapters from PEFT folders Reef writes and load them under a name over HTTP;
the runtime both build on is `engine_base.py`, and what differs (routes, request shapes,
supervision) stays in `vllm.py` and `sglang.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from pathlib import Path
from typing import Awaitable, Callable, Mapping

from reef.core.errors import RuntimeFailure
from reef.runtimes.upstream_wire import error_text

RETRY_AFTER = "5"


class EngineUnavailable(RuntimeFailure):
    """The engine is down or restarting: 503, in the client's dialect, with a Retry-After, so a
    client retries instead of treating a restart as a broken request."""

    def __init__(self, message: str) -> None:
        super().__init__(message, error_type="overloaded_error")
        self.status = 503
        self.with_headers({"retry-after": RETRY_AFTER})


def adapter_files(files: Mapping[str, bytes]) -> dict[str, bytes] | None:
    """The PEFT adapter inside a release's content (at its root or in a sub-folder, as the
    trainer's `save_pretrained` puts a named adapter), or None when the content carries no
    weights (a harness-only release serves the base model). The same rule as the embedded
    runtime's, without importing torch."""
    config = next(
        (
            name
            for name in sorted(files)
            if name.rsplit("/", 1)[-1] == "adapter_config.json" and not name.startswith("harness/")
        ),
        None,
    )
    if config is None:
        return None
    prefix = config[: -len("adapter_config.json")]
    return {
        name[len(prefix) :]: data
        for name, data in files.items()
        if name.startswith(prefix) and "/" not in name[len(prefix) :]
    }


def error_message(raw: str) -> str:
    """The message inside an engine's error body (OpenAI-style `error`, vLLM's, SGLang's
    `error_message` of an adapter update), else the body itself; at most 500 characters, so a
    log line or a client's error stays readable."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw[:500].strip() or "(empty body)"
    if isinstance(body, dict) and body.get("error_message"):
        return str(body["error_message"])[:500]
    return error_text(body)[0][:500]


async def load_adapter(
    engine: str,
    content_id: str,
    folder: Path,
    adapter: Mapping[str, bytes],
    *,
    load: Callable[[], Awaitable[None]],
    unload: Callable[[], Awaitable[None]],
    timeout: float,
) -> None:
    """Write `adapter` as a PEFT folder and have the engine load it (`load`) within `timeout`
    seconds. A load that fails or times out is unloaded again (the engine may hold half of it)
    and its folder deleted before RuntimeFailure is raised: the serving pointer has not moved,
    so the previous release keeps serving."""
    folder.mkdir(parents=True)
    for file_name, data in adapter.items():
        (folder / file_name).write_bytes(data)
    try:
        await asyncio.wait_for(load(), timeout)
    except (Exception, asyncio.CancelledError) as exc:
        with contextlib.suppress(Exception):  # nothing half-loaded stays behind
            await asyncio.wait_for(unload(), 30)
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(exc, asyncio.CancelledError):
            raise
        if isinstance(exc, asyncio.TimeoutError):
            raise RuntimeFailure(f"{engine} did not load content {content_id} within {timeout:.0f}s") from None
        raise RuntimeFailure(f"{engine} could not load content {content_id} as a LoRA adapter: {exc}") from None
