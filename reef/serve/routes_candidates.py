"""`GET /reef/scenarios/{s}/candidates`: every candidate of a scenario, read from its commit log
(`reef.commit.candidate_fates`): the batch it came from, its fate, the gate's numbers, its
training steps, the mean reward of its batch, and the live scores of its canary (the records a
canary served name `canary-<batch id>`); with the counts of each fate, which survive a restart.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from fastapi import APIRouter, Request

from reef.commit.candidate_fates import candidate_fates, fate_counts
from reef.core.canonical import check_scenario_name
from reef.core.errors import NotFound
from reef.grow.canary import canary_release_id
from reef.serve.routes_reef import release_tally

MAX_CANDIDATES = 200  # the newest shown; the counts cover them all
# (scenario, batch id) -> the mean score of its reports; a logged batch never changes
_REWARDS: dict[tuple[str, str], float | None] = {}
_REWARDS_LOCK = threading.Lock()


def build_router() -> APIRouter:
    router = APIRouter(prefix="/reef")

    @router.get("/scenarios/{name}/candidates")
    async def candidates(name: str, request: Request) -> dict[str, Any]:
        """Newest first; `counts` over every candidate the log holds."""
        app = request.app.state.reef
        chain = app.state.chain(check_scenario_name(name))
        return await asyncio.to_thread(_candidates, app, chain)

    return router


def _candidates(app: Any, chain: Any) -> dict[str, Any]:
    rows = candidate_fates(chain.history())
    sums, reports, records = release_tally(app, chain.scenario)
    shown = rows[-MAX_CANDIDATES:][::-1]
    for row in shown:
        canary = canary_release_id(row["batch_id"])
        row["canary"] = (
            {
                "release_id": canary,
                "records": records.get(canary, 0),
                "reports": reports.get(canary, 0),
                "live_mean": sums[canary] / reports[canary] if reports.get(canary) else None,
            }
            if records.get(canary)
            else None
        )
        row["reward_mean"] = _reward_mean(app.store, chain.scenario, row["batch_id"], row.pop("report_ids"))
    return {"scenario": chain.scenario, "counts": fate_counts(rows), "candidates": shown}


def _reward_mean(store: Any, scenario: str, batch_id: str, report_ids: list[str]) -> float | None:
    """The mean score of the reports the batch was made of (read once per batch)."""
    key = (scenario, batch_id)
    with _REWARDS_LOCK:
        if key in _REWARDS:
            return _REWARDS[key]
    scores = []
    for report_id in report_ids:
        try:
            scores.append(store.get_report(report_id).score)
        except NotFound:
            continue
    mean = sum(scores) / len(scores) if scores else None
    with _REWARDS_LOCK:
        _REWARDS[key] = mean
    return mean
