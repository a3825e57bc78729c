"""A scenario's run-time settings, revisioned: `GET /reef/scenarios/{s}/config` and `POST` to it.

`GET` answers the scenario's effective settings (the config's, with the live changes the commit
log holds) with an `ETag`, the revision. `POST` changes the training mode and the live learner
settings (`reef/grow/live_settings.py`: a small allow-list; anything else is refused naming the
field) only with `If-Match` naming the current revision: without it 428, with a stale one 412 and
the current `ETag`, with nothing logged either way. Each change is one `settings` step of the
commit log (`reef/commit/scenario_settings.py`), listed in `history` here, and the learner reads
it at its next step.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from reef.commit.release_chain import ReleaseChain
from reef.commit.scenario_settings import TRAINING_MODES, ScenarioSettings, StaleRevision, change_settings, settings_of
from reef.config import find_recipe
from reef.core.canonical import check_scenario_name
from reef.core.errors import InvalidInput
from reef.core.types import Operation
from reef.grow.live_settings import LiveBase, check_changes, effective, redacted, resolve
from reef.serve.http_errors import error_response
from reef.serve.inference import parse_json


def build_router() -> APIRouter:
    router = APIRouter(prefix="/reef")

    @router.get("/scenarios/{name}/config")
    async def read(name: str, request: Request) -> JSONResponse:
        app = request.app.state.reef
        chain = app.state.chain(check_scenario_name(name))
        settings = await asyncio.to_thread(settings_of, chain)
        return JSONResponse(config_view(app, chain, settings), headers={"ETag": settings.etag()})

    @router.post(
        "/scenarios/{name}/config",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"type": "object"}}},
                "description": "live settings to change, with If-Match: the ETag of GET .../config",
            }
        },
    )
    async def change(name: str, request: Request) -> JSONResponse:
        app = request.app.state.reef
        chain = app.state.chain(check_scenario_name(name))
        changes = _changes(parse_json(await request.body()), _base(app, chain))
        if_match = request.headers.get("if-match")
        if not if_match:
            message = (
                "a change needs If-Match: the ETag of GET /reef/scenarios/{s}/config (the revision it was made against)"
            )
            return error_response(request.url.path, 428, message, "precondition_required")
        try:
            settings = await asyncio.to_thread(change_settings, chain, changes, _revision(if_match))
        except StaleRevision as exc:
            current = await asyncio.to_thread(settings_of, chain)
            return error_response(
                request.url.path, 412, str(exc), "precondition_failed", headers={"ETag": current.etag()}
            )
        return JSONResponse(config_view(app, chain, settings), headers={"ETag": settings.etag()})

    return router


def config_view(app: Any, chain: ReleaseChain, settings: ScenarioSettings) -> dict[str, Any]:
    base = _base(app, chain)
    recipe_settings, gate, _ = resolve(base, settings.live)
    history = [
        {"step": e.step, "recorded_at": e.recorded_at, "changes": e.metrics.get("settings") or {}}
        for e in chain.history()
        if e.operation is Operation.SETTINGS
    ]
    return {
        "scenario": chain.scenario,
        "recipe": chain.binding["recipe"],
        "surface": base.surface,
        "revision": settings.revision,
        "training_mode": settings.training_mode,
        "live": effective(base, settings.live),
        "changed": settings.live,
        "recipe_settings": redacted(recipe_settings),
        "gate": redacted(gate) if base.surface == "weights" else None,
        "history": history,
    }


def _base(app: Any, chain: ReleaseChain) -> LiveBase:
    name = chain.binding["recipe"]
    learner = app.config.learner
    return LiveBase(
        find_recipe(name).surface,
        learner.settings_for(name),
        learner.gate,
        learner.canary.get(chain.scenario),
        learner.canary_max_fraction,
    )


def _changes(body: Any, base: LiveBase) -> dict[str, Any]:
    if not isinstance(body, dict) or not body:
        raise InvalidInput('the body must be a JSON object naming the settings to change, e.g. {"lr": 0.0002}')
    changes = dict(body)
    mode = changes.pop("training_mode", None)
    if mode is not None and mode not in TRAINING_MODES:
        raise InvalidInput(f"training_mode must be one of {', '.join(TRAINING_MODES)}, got {mode!r}")
    checked = check_changes(base, changes)
    return {**({"training_mode": mode} if mode is not None else {}), **checked}


def _revision(if_match: str) -> int | None:
    """The revision an `If-Match` names (None: `*`, any revision); one that names none matches none."""
    value = if_match.strip()
    if value == "*":
        return None
    value = value.removeprefix("W/").strip('"')
    return int(value) if value.isascii() and value.isdigit() else -1
