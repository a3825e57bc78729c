"""Records users already have, as Reef's own: the items of `POST /reef/records/batch`.

Each item is an exchange served elsewhere: the request body as its client sent it and the
provider's response body, in the OpenAI (chat completions) or Anthropic (messages) dialect. Both
go through the same parsers as served traffic (the request through the dialect's request parser,
the response through the upstream runtime's answer parser), so an imported record reads like a
served one: the request in Reef's shape, the response as `ChatResult.response_json` has it. It
is marked `imported`, names no release and carries no token ids or log-probs (a weights recipe
that needs them drops it, `reef/grow/rollouts.py`). A score (and feedback) becomes a report on it,
the same as `POST /reef/report` stores.

An item's id is the client's receipt: with one, a retry of the batch is idempotent (its report
id follows from the record id); without one, every import stores a new record.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef.config.serve import RequestLimits
from reef.core.canonical import check_depth, check_id, check_scenario_name, new_id
from reef.core.chat import ChatResult
from reef.core.errors import InvalidInput, ReefError
from reef.core.types import Record, RecordStatus, Report
from reef.observe.rules import BatchItem
from reef.runtimes.upstream_wire import AnthropicStream, OpenAIStream, UpstreamProblem
from reef.serve import anthropic_wire, openai_wire
from reef.serve.inference import parse_json

MAX_ITEMS = 1000
_AN = {"openai": "an OpenAI chat completion", "anthropic": "an Anthropic message"}


class ImportItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, description="Client-chosen receipt, for retry safety")
    scenario: str | None = Field(None, description="Default: the x-reef-scenario header, else `default`")
    dialect: Literal["openai", "anthropic"]
    request: dict[str, Any] = Field(description="The request body as the client sent it")
    response: dict[str, Any] = Field(description="The provider's response body")
    score: float | None = Field(None, strict=True, allow_inf_nan=False, description="Stored as a report")
    feedback: str | dict[str, Any] | None = None
    session: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)


class ImportBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    records: list[ImportItem] = Field(min_length=1, max_length=MAX_ITEMS)


def parse_batch(raw: bytes, default_scenario: str, limits: RequestLimits) -> list[BatchItem]:
    """The batch's items as records and reports, or `InvalidInput` naming the first bad item
    and field (`records[3].response: ...`); nothing is stored either way."""
    try:
        body = ImportBody.model_validate(parse_json(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(f"{_where(first['loc'])}: {first['msg']}") from None
    return [_item(i, item, default_scenario, limits) for i, item in enumerate(body.records)]


def report_id_for(record_id: str) -> str:
    """The report of an imported record with a client-chosen id: the same id on every retry."""
    return "import-" + hashlib.sha256(record_id.encode()).hexdigest()[:32]


def _item(i: int, item: ImportItem, default_scenario: str, limits: RequestLimits) -> BatchItem:
    field = "scenario"
    try:
        scenario = check_scenario_name(item.scenario or default_scenario)
        field = "id"
        record_id = check_id(item.id, "id") if item.id is not None else new_id()
        field = "session"
        session = check_id(item.session, "session") if item.session is not None else None
        field = "tags"
        _check_tags(item.tags, limits)
        field = "request"
        check_depth(item.request, limits.max_json_depth, "request")
        request = _parse_request(item)
        field = "response"
        check_depth(item.response, limits.max_json_depth, "response")
        response = _parse_response(item)
        field = "feedback"
        check_depth(item.feedback, limits.max_json_depth, "feedback")
        if item.feedback is not None and item.score is None:
            raise InvalidInput("feedback needs a score (a report is a score with optional feedback)")
    except ReefError as exc:
        raise InvalidInput(f"records[{i}].{field}: {exc}") from None
    record = Record(
        id=record_id,
        scenario=scenario,
        release=None,
        request=request,
        status=RecordStatus.COMPLETE,
        response=response,
        session=session,
        tags=dict(item.tags),
        imported=True,
    )
    if item.score is None:
        return record, None
    report_id = report_id_for(record_id) if item.id is not None else new_id()
    report = Report(report_id, scenario, (record_id,), item.score, item.feedback, {"imported": True})
    return record, report


def _parse_request(item: ImportItem) -> dict[str, Any]:
    if item.dialect == "openai":
        return openai_wire.parse_chat_request(item.request).to_json()
    return anthropic_wire.parse_messages_request(item.request).to_json()


def _parse_response(item: ImportItem) -> dict[str, Any]:
    parser = OpenAIStream(None) if item.dialect == "openai" else AnthropicStream(None)
    result = ChatResult()
    try:
        for delta in parser.whole(item.response):
            result.add(delta)
    except UpstreamProblem as exc:
        raise InvalidInput(f"not {_AN[item.dialect]} response body: it {exc}") from None
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise InvalidInput(f"not {_AN[item.dialect]} response body ({type(exc).__name__}: {exc})") from None
    return result.response_json()


def _check_tags(tags: dict[str, str], limits: RequestLimits) -> None:
    """The limits a served request's x-reef-tag-* headers have."""
    if len(tags) > limits.max_tags:
        raise InvalidInput(f"{len(tags)} tags; at most {limits.max_tags} (limits.max_tags)")
    for name, value in tags.items():
        check_id(name, "tag name")
        if len(value) > limits.max_tag_bytes:
            raise InvalidInput(
                f"tag {name} is {len(value)} bytes; at most {limits.max_tag_bytes} (limits.max_tag_bytes)"
            )


def _where(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the client wrote it: `records[3].dialect`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"
