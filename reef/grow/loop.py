"""The loop every learner runs: one step after another, forever, never ended by a failed step."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Protocol

log = logging.getLogger("reef.learner")


class HasLastError(Protocol):
    last_error: str | None


async def keep_stepping(
    name: str, step: Callable[[], Awaitable[bool]], stats: HasLastError, poll_interval: float
) -> None:
    """Run `step` until cancelled, sleeping `poll_interval` after a step that found no work; a
    failing step is logged and shown as `stats.last_error`, and learning goes on."""
    while True:
        try:
            busy = await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed step must not end learning
            log.exception("%s: step failed", name)
            stats.last_error = f"{type(exc).__name__}: {exc}"
            busy = False
        if not busy:
            await asyncio.sleep(poll_interval)
