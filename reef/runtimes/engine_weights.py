"""The weights an inference engine (vLLM, SGLang) holds, and the swap from one set to another.

An engine holds one set of weights at a time: the base model's, or one full-weight release's
(LoRA adapters ride on the base). A swap is a push into the running engine (vLLM reloads its
weights from a safetensors folder, SGLang updates them from disk) behind one timeout:

1. new requests wait (they start on the new weights once the swap ends);
2. requests in flight finish on the weights they started with (at most the timeout);
3. the engine reloads, its prefix cache is reset (no KV of older weights serves newer ones);
4. the waiting requests go on, stamped with the load whose weights serve them.

So every token's load is known: a request frozen to a release whose weights are no longer the
engine's (admitted just before a swap, sent after it) is served by, and stamped with, the load
now resident; its record then names that load, fails the provenance check and is not trained on.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

from reef.core.errors import RuntimeFailure


class ResidentWeights:
    def __init__(self) -> None:
        self.folder: Path | None = None  # the full-weight release's folder the engine holds; None: the base
        self.load_id: str | None = None  # the load whose weights these are (None: the base the engine started on)
        self.swaps = 0  # pushes that completed (tests, /reef/status)
        self._swapping = False
        self._pushing = False  # this swap's push began: a failure must put the engine back
        self._in_flight = 0
        self._cond = asyncio.Condition()
        self._one_at_a_time = asyncio.Lock()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[str | None]:
        """Hold the resident weights for one request (waiting out a swap); yields their load."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._swapping)
            self._in_flight += 1
            resident = self.load_id
        try:
            yield resident
        finally:
            async with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    async def swap(
        self,
        folder: Path | None,
        load_id: str,
        push: Callable[[], Awaitable[None]],
        restore: Callable[[Path | None], Awaitable[None]],
        timeout: float,
    ) -> None:
        """Make `folder` (None: the base) the engine's weights by `push`, once the requests in
        flight finished, all within `timeout` seconds. On failure `restore` puts the engine back
        on the weights it held (its half-done update cleared) before any request goes on, and
        RuntimeFailure is raised."""
        async with self._one_at_a_time:
            async with self._cond:
                self._swapping = True
                self._pushing = False
            try:
                await asyncio.wait_for(self._drain_and_push(push), timeout)
                self.folder, self.load_id = folder, load_id
                self.swaps += 1
            except (Exception, asyncio.CancelledError) as exc:
                try:
                    if self._pushing:  # else the engine never left the weights it holds
                        await asyncio.wait_for(restore(self.folder), timeout)
                except Exception as again:  # the engine holds weights nobody can name: say so loudly
                    raise RuntimeFailure(f"the weight push failed ({exc!r}) and so did going back ({again!r})") from exc
                if isinstance(exc, asyncio.TimeoutError):
                    raise RuntimeFailure(f"the weight push did not finish within {timeout:.0f}s") from None
                raise
            finally:
                async with self._cond:
                    self._swapping = False
                    self._cond.notify_all()

    async def _drain_and_push(self, push: Callable[[], Awaitable[None]]) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self._in_flight == 0)
        self._pushing = True
        await push()
