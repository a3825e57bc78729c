"""Telling a scenario what to learn and when: instructions, training modes, train-now.

- `POST /reef/train {"scenario", "instruction", "references"?}` stores an instruction
  (`reef/grow/instructions.py`) and answers its receipt (`x-reef-agent-record-id`, client-chosen
  for retry safety as on inference); `GET /reef/train/{id}` says where it stands. Only a recipe
  that takes instructions gets one, and only in `manual` or `hybrid` mode: anything else is a 409
  saying why, with nothing stored.
- `POST /reef/scenarios/{s}/update {"training_mode"}` sets `auto`, `manual` or `hybrid`;
  `POST /reef/scenarios/{s}/train-now` asks for the next batch (in `manual` or `hybrid`).
Each is a step of the scenario's commit log (`reef/commit/scenario_settings.py`), read by the
learner wherever it runs.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from reef.commit.release_chain import ReleaseChain
from reef.commit.scenario_settings import (
    change_settings,
    log_instruction,
    request_train_now,
    settings_of,
)
from reef.config import find_recipe
from reef.core.canonical import check_id, check_scenario_name, new_id
from reef.core.errors import Conflict, InvalidInput, NotFound, RecordConflict
from reef.grow.instructions import (
    MAX_INSTRUCTION_CHARS,
    instruction_items,
    instruction_progress,
    is_instruction,
    takes_instructions,
)
from reef.serve.openapi_bodies import model_body
from reef.serve.routes_reef import validated

RECEIPT = "x-reef-agent-record-id"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TrainBody(_Body):
    scenario: str = Field(description="The scenario to teach")
    instruction: str = Field(description="What to learn, in words", min_length=1, max_length=MAX_INSTRUCTION_CHARS)
    references: list[str] = Field(default_factory=list, description="Receipts the instruction is about")


class UpdateBody(_Body):
    training_mode: Literal["auto", "manual", "hybrid"] = Field(description="When the scenario trains")


class TrainNowBody(_Body):
    pass


def build_router() -> APIRouter:
    router = APIRouter(prefix="/reef")

    @router.post("/train", openapi_extra=model_body(TrainBody, "an instruction to learn from"))
    async def train(request: Request) -> JSONResponse:
        body: TrainBody = validated(TrainBody, await request.body())
        app = request.app.state.reef
        if not body.instruction.strip():
            raise InvalidInput("instruction must say something (it is blank)")
        chain = app.state.chain(check_scenario_name(body.scenario))
        instruction_id = check_id(request.headers.get(RECEIPT) or new_id(), RECEIPT)
        references = list(dict.fromkeys(check_id(r, "reference") for r in body.references))
        limit = app.config.limits.max_report_references
        if len(references) > limit:
            raise InvalidInput(f"an instruction names at most {limit} receipts (limits.max_report_references)")
        await asyncio.to_thread(_check_teachable, app, chain, instruction_id, references)
        record, report = instruction_items(chain.scenario, instruction_id, body.instruction, references)
        await asyncio.to_thread(log_instruction, chain, instruction_id, body.instruction, references)
        await asyncio.to_thread(app.store.put_batch, [(record, report)])
        progress = await asyncio.to_thread(instruction_progress, chain.history(), instruction_id)
        answer = {"instruction_id": instruction_id, "scenario": chain.scenario, **progress}
        return JSONResponse(answer, headers={RECEIPT: instruction_id})

    @router.get("/train/{instruction_id}")
    async def progress(instruction_id: str, request: Request) -> dict[str, Any]:
        app = request.app.state.reef
        record = await asyncio.to_thread(app.store.get_record, check_id(instruction_id, "instruction id"))
        if not is_instruction(record):
            raise NotFound(f"record {instruction_id} is not an instruction (POST /reef/train gives those)")
        chain = app.state.chain(record.scenario)
        return {
            "instruction_id": record.id,
            "scenario": record.scenario,
            "instruction": record.request.get("instruction"),
            "references": record.request.get("references") or [],
            **await asyncio.to_thread(instruction_progress, chain.history(), record.id),
        }

    @router.post("/scenarios/{name}/update", openapi_extra=model_body(UpdateBody, "the scenario's training mode"))
    async def update(name: str, request: Request) -> dict[str, Any]:
        body: UpdateBody = validated(UpdateBody, await request.body())
        chain = request.app.state.reef.state.chain(check_scenario_name(name))
        settings = await asyncio.to_thread(settings_of, chain)
        if settings.training_mode != body.training_mode:  # the same mode again logs nothing
            settings = await asyncio.to_thread(change_settings, chain, {"training_mode": body.training_mode}, None)
        return {"scenario": name, "training_mode": settings.training_mode, "revision": settings.revision}

    @router.post("/scenarios/{name}/train-now", openapi_extra=model_body(TrainNowBody, "nothing (an empty object)"))
    async def train_now(name: str, request: Request) -> dict[str, Any]:
        raw = await request.body()
        if raw.strip():
            validated(TrainNowBody, raw)
        chain = request.app.state.reef.state.chain(check_scenario_name(name))
        settings = await asyncio.to_thread(settings_of, chain)
        _check_mode(chain.scenario, settings.training_mode, "ask for a batch")
        step = settings.train_now or (await asyncio.to_thread(request_train_now, chain)).step
        return {"scenario": name, "training_mode": settings.training_mode, "requested_at_step": step}

    return router


def _check_teachable(app: Any, chain: ReleaseChain, instruction_id: str, references: list[str]) -> None:
    """Refuse, before anything is stored, an instruction this scenario cannot learn from now."""
    name = chain.binding["recipe"]
    recipe = find_recipe(name)
    if not takes_instructions(recipe):
        raise Conflict(
            f"scenario {chain.scenario!r} learns with the {name} recipe, which takes no instructions: "
            f"it learns {recipe.surface} from scored traffic only (a harness recipe such as skills turns "
            "an instruction into a rule)"
        )
    _check_mode(chain.scenario, settings_of(chain).training_mode, "give it instructions")
    for ref in references:
        try:
            if app.store.get_record(ref).scenario != chain.scenario:
                raise InvalidInput(f"receipt {ref} is of another scenario than {chain.scenario!r}")
        except NotFound:
            raise NotFound(f"unknown receipt {ref}") from None
    try:
        existing = app.store.get_record(instruction_id)
    except NotFound:
        return
    if not is_instruction(existing) or existing.scenario != chain.scenario:
        raise RecordConflict(f"receipt {instruction_id} is already a record of other content; choose another")


def _check_mode(scenario: str, mode: str, what: str) -> None:
    if mode == "auto":
        raise Conflict(
            f"scenario {scenario!r} trains in auto mode, from its traffic alone: set it to manual or hybrid "
            f'to {what} (POST /reef/scenarios/{scenario}/update {{"training_mode": "hybrid"}})'
        )
