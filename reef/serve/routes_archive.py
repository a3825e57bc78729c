"""`DELETE /reef/scenarios/{name}`: archive a scenario (reef/commit/archive.py).

Its learner stops first (nothing appends to its log meanwhile), then its records, commit log
and artifact ref move aside under `archived/<name>/<stamp>`, nothing deleted, and what served it
is unloaded once the requests in flight end. Those requests' records, written after the move,
land under the name, which is free again: a request to it creates a new scenario, empty, under
today's rules (`limits.max_scenarios`). `reef inspect` lists archived scenarios.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from reef.commit.archive import archive_scenario
from reef.core.canonical import check_scenario_name


def build_router() -> APIRouter:
    router = APIRouter(prefix="/reef")

    @router.delete("/scenarios/{name}")
    async def archive(name: str, request: Request) -> dict[str, Any]:
        app = request.app.state.reef
        app.state.chain(check_scenario_name(name))  # 404 for an unknown scenario, before anything stops
        await app.learning.forget(name)
        try:
            done = await app.scenarios.retire(name, lambda: asyncio.to_thread(archive_scenario, app.state, name))
        except BaseException:
            if name in app.state.scenarios():  # not archived (the store or the log refused): it learns on
                await app.learning.ensure(name)
            raise
        return {"archived": done.to_json()}

    return router
