"""`POST /reef/records/batch`: import records users already have (reef/serve/record_import.py).

The whole batch is checked before anything is stored, each scenario it names is admitted as a
served request's would be (created on first use under today's rules: `limits.max_scenarios`),
and its records and reports are stored in one transaction: all of them or none. The answer
gives each item's receipt in order. Its body may be 16 times `max_body_bytes` (64 MiB by default).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from reef.serve.openapi_bodies import model_body
from reef.serve.record_import import ImportBody, parse_batch

BATCH_PATH = "/reef/records/batch"
BATCH_BODY_FACTOR = 16  # 1000 records of a few KB each: well past one request's limit, by design


def body_limit(max_body_bytes: int) -> tuple[int, str]:
    """The batch route's own body limit, and how its 413 names it."""
    return BATCH_BODY_FACTOR * max_body_bytes, f"{BATCH_BODY_FACTOR} times max_body_bytes, for a batch import"


def build_router() -> APIRouter:
    router = APIRouter()

    @router.post(BATCH_PATH, openapi_extra=model_body(ImportBody, "records served elsewhere, 1-1000"))
    async def import_records(request: Request) -> JSONResponse:
        app = request.app.state.reef
        default_scenario = request.headers.get("x-reef-scenario") or "default"
        items = parse_batch(await request.body(), default_scenario, app.config.limits)
        for scenario in dict.fromkeys(record.scenario for record, _ in items):
            await app.scenarios.resolve(scenario)
        stored = await asyncio.to_thread(app.store.put_batch, items)
        for record, report in stored:
            if report is not None:
                app.metrics.reports.labels(record.scenario).inc()
        return JSONResponse(
            {"imported": len(stored), "receipts": [_receipt(i, *item) for i, item in enumerate(stored)]}
        )

    return router


def _receipt(index: int, record: Any, report: Any) -> dict[str, Any]:
    return {
        "index": index,
        "record_id": record.id,
        "scenario": record.scenario,
        "report_id": report.id if report is not None else None,
    }
