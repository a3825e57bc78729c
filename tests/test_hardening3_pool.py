"""Many stalled requests against the upstream runtime's connection pool (issue 63, item 10).

A real `reef serve` on the upstream runtime in front of the scripted provider, which holds every
request whose prompt is "stall" without answering (a provider stuck on some calls). More of
them are opened at once than the pool held (256 connections); a normal request must still be
answered within a few seconds, and every stalled request reaches the provider (none waits in a
hidden queue behind the others); once the provider answers them, all of them complete.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream, _user_text

STALLED = 300  # more than the 256 connections the pool held
ANSWERED_WITHIN_S = 5.0


class StallingProvider:
    """The scripted upstream, holding every "stall" prompt until `release` is set."""

    def __init__(self, upstream: ScriptedUpstream) -> None:
        self.upstream = upstream
        self.release = threading.Event()
        self.holding = 0
        answer = upstream.app._answer

        async def stall_or_answer(anthropic: bool, body: dict[str, Any], size: int, receive: Any, send: Any) -> None:
            if _user_text(body) == "stall":
                self.holding += 1  # one event loop: no lock needed
                try:
                    while not (self.release.is_set() or upstream.app.closing):
                        await asyncio.sleep(0.05)
                finally:
                    self.holding -= 1
            await answer(anthropic, body, size, receive, send)

        upstream.app._answer = stall_or_answer  # type: ignore[method-assign]


@pytest.fixture
def provider() -> Iterator[StallingProvider]:
    with ScriptedUpstream(record=False) as upstream:
        stalling = StallingProvider(upstream)
        try:
            yield stalling
        finally:
            stalling.release.set()


def chat(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


async def stalled_then_normal(url: str, provider: StallingProvider) -> tuple[float, int, list[int]]:
    """Open STALLED stalled requests, then time a normal one; release the stalled ones.
    (seconds the normal request took, stalled requests the provider held, their statuses)."""
    limits = httpx.Limits(max_connections=STALLED + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        stalled = [asyncio.create_task(client.post("/v1/chat/completions", json=chat("stall"))) for _ in range(STALLED)]
        deadline = time.monotonic() + 60
        while provider.holding < 256:  # the old pool's size: it is full now
            assert time.monotonic() < deadline, f"only {provider.holding} stalled requests reached the provider"
            await asyncio.sleep(0.05)
        start = time.monotonic()
        try:
            normal = await asyncio.wait_for(client.post("/v1/chat/completions", json=chat("hello")), ANSWERED_WITHIN_S)
        except TimeoutError:
            raise AssertionError(
                f"a normal request was not answered within {ANSWERED_WITHIN_S} s while "
                f"{provider.holding} requests stalled at the provider"
            ) from None
        took = time.monotonic() - start
        assert normal.status_code == 200 and normal.json()["choices"][0]["message"]["content"] == "echo: hello"
        deadline = time.monotonic() + 30
        while provider.holding < STALLED:  # none waits in the pool behind the others
            assert time.monotonic() < deadline, f"only {provider.holding} of {STALLED} reached the provider"
            await asyncio.sleep(0.05)
        holding = provider.holding
        provider.release.set()
        statuses = [r.status_code for r in await asyncio.gather(*stalled)]
    return took, holding, statuses


def test_a_normal_request_is_answered_while_more_requests_stall_than_the_pool_held(
    provider: StallingProvider, tmp_path: Path
) -> None:
    settings = {
        "upstream": {"url": provider.upstream.base_url, "model": "p", "timeout": 60},
        "recipes": {"default": "skills"},
        "learner": {"enabled": False},
    }
    with ReefServer(tmp_path, settings) as reef:
        took, holding, statuses = asyncio.run(stalled_then_normal(reef.url, provider))
        print(f"normal request answered in {took * 1000:.0f} ms beside {holding} stalled ones")
        assert holding == STALLED
        assert statuses == [200] * STALLED
        assert httpx.get(f"{reef.url}/healthz", timeout=5).status_code == 200
