"""A scenario's records as the dashboard lists them: newest first, a page at a time, filtered,
and one conversation's turns in order.

`GET /reef/scenarios/{s}/records` reads backwards along the store's (scenario, seq) index from
`before_seq` (the previous page's `next_before_seq`), so a page costs the rows it reads, however
old the scenario. Filters the index cannot answer (session, client, score) are applied to the
rows read, and a call reads at most `MAX_SCAN` of them: a rare match far back is reached page by
page (`next_before_seq`), never by one call reading the whole scenario.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Sequence

from fastapi import APIRouter, Request

from reef.core.canonical import check_id, check_scenario_name
from reef.core.errors import InvalidInput
from reef.core.provenance import verified
from reef.core.types import Record, RecordStatus, Report
from reef.observe.record_query import StoredRecord
from reef.observe.rules import NO_SEQ_ABOVE

MAX_RECORDS_LIMIT = 500
MAX_SCAN = 2000  # rows one filtered call reads at most (about 0.1-0.3 s on one core)
MAX_SESSION_TURNS = 500
_EXCERPT = 160


@dataclass(frozen=True)
class RecordFilter:
    """What the rows read must match besides the scenario (None: anything)."""

    session: str | None = None
    client: str | None = None  # a part of the User-Agent, any case
    min_score: float | None = None  # the latest report's score
    max_score: float | None = None
    scored: bool | None = None  # True: some report names it; False: none does

    def active(self) -> bool:
        return any(v is not None for v in (self.session, self.client, self.min_score, self.max_score, self.scored))

    def matches(self, stored: StoredRecord) -> bool:
        record, last = stored.record, stored.reports[-1] if stored.reports else None
        if self.session is not None and record.session != self.session:
            return False
        if self.client is not None and self.client.lower() not in (record.client or "").lower():
            return False
        if self.scored is not None and (last is not None) != self.scored:
            return False
        if self.min_score is not None and (last is None or last.score < self.min_score):
            return False
        return self.max_score is None or (last is not None and last.score <= self.max_score)


def build_router() -> APIRouter:
    router = APIRouter(prefix="/reef")

    @router.get("/scenarios/{name}/records")
    async def records(
        name: str,
        request: Request,
        limit: str = "50",
        release_id: str | None = None,
        before_seq: str | None = None,
        status: str | None = None,
        session: str | None = None,
        client: str | None = None,
        min_score: str | None = None,
        max_score: str | None = None,
        scored: str | None = None,
    ) -> dict[str, Any]:
        """The scenario's records, newest first, each with its latest report; `next_before_seq`
        continues the listing (null: nothing older)."""
        app = request.app.state.reef
        app.state.chain(check_scenario_name(name))  # 404 for an unknown scenario
        wanted = RecordFilter(
            session=check_id(session, "session") if session else None,
            client=_text(client, "client"),
            min_score=_number(min_score, "min_score"),
            max_score=_number(max_score, "max_score"),
            scored=_yes_no(scored, "scored"),
        )
        page = await asyncio.to_thread(
            listing,
            app.store,
            name,
            _whole(limit, "limit", 1, MAX_RECORDS_LIMIT),
            check_id(release_id, "release_id") if release_id else None,
            wanted,
            before_seq=_whole(before_seq, "before_seq", 1, NO_SEQ_ABOVE) if before_seq else None,
            statuses=_statuses(status),
        )
        return {"scenario": name, **page}

    @router.get("/scenarios/{name}/sessions/{session}")
    async def session_turns(name: str, session: str, request: Request) -> dict[str, Any]:
        """Every turn of one conversation (`x-reef-session`, or the agent's own session id), oldest first."""
        app = request.app.state.reef
        app.state.chain(check_scenario_name(name))
        turns = await asyncio.to_thread(_session_rows, app.store, name, check_id(session, "session"))
        return {"scenario": name, "session": session, "turns": turns}

    return router


def listing(
    store: Any,
    scenario: str,
    limit: int,
    release_id: str | None,
    wanted: RecordFilter = RecordFilter(),
    *,
    before_seq: int | None = None,
    statuses: Sequence[RecordStatus] | None = None,
) -> dict[str, Any]:
    """Up to `limit` matching records, newest first, and the cursor of the next page."""
    filtered = wanted.active() or release_id is not None
    page_size = max(limit, 500) if filtered else limit + 1  # one more: is there a next page?
    rows = store.iter_records(
        scenario,
        release_id=release_id,
        statuses=statuses,
        newest_first=True,
        page_size=page_size,
        before_seq=before_seq,
    )
    found: list[dict[str, Any]] = []
    last_seq: int | None = None
    scanned, more = 0, False
    for stored in rows:
        if len(found) == limit or scanned == MAX_SCAN:  # a row beyond this page: there is a next one
            more = True
            break
        scanned, last_seq = scanned + 1, stored.record.seq
        if wanted.matches(stored):
            found.append(record_row(stored))
    return {"records": found, "next_before_seq": last_seq if more else None, "scanned": scanned}


def record_row(stored: StoredRecord) -> dict[str, Any]:
    record: Record = stored.record
    last = stored.reports[-1] if stored.reports else None
    duration = record.timings.get("duration_s")
    if duration is None and stored.finished_at is not None:
        duration = stored.finished_at - stored.created_at
    return {
        "id": record.id,
        "seq": record.seq,
        "status": record.status.value,
        "release_id": record.release.release_id if record.release else None,
        "session": record.session,
        "client": record.client,
        "tags": record.tags,
        "created_at": stored.created_at,
        "latency_s": duration,
        "verified": verified(record),
        "reports": len(stored.reports),
        "score": last.score if last else None,
        "feedback": last.feedback if last else None,
        "prompt": _excerpt(_last_user_text(record.request)),
        "answer": _excerpt((record.response or {}).get("text") or ""),
        "error": record.error,
    }


def _session_rows(store: Any, scenario: str, session: str) -> list[dict[str, Any]]:
    rows = []
    for record in store.session_records(scenario, session)[:MAX_SESSION_TURNS]:
        reports: tuple[Report, ...] = tuple(store.reports_for(record.id))
        admitted = float(record.timings.get("admitted_at") or 0.0)
        row = record_row(StoredRecord(record, admitted, None, reports))
        row["messages"] = len(record.request.get("messages") or [])
        rows.append(row)
    return rows


def _last_user_text(request: dict[str, Any]) -> str:
    for message in reversed(request.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else str(content)
    return ""


def _excerpt(text: str) -> str:
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 1] + "…"


def _whole(raw: str, name: str, low: int, high: int) -> int:
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19 and low <= int(raw) <= high):
        raise InvalidInput(f"{name} must be a whole number {low}..{high}, got {raw!r}")
    return int(raw)


def _number(raw: str | None, name: str) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be a number, got {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidInput(f"{name} must be finite, got {raw!r}")
    return value


def _yes_no(raw: str | None, name: str) -> bool | None:
    if raw is None or raw == "":
        return None
    if raw not in ("true", "false"):
        raise InvalidInput(f"{name} must be true or false, got {raw!r}")
    return raw == "true"


def _text(raw: str | None, name: str) -> str | None:
    if raw is None or raw == "":
        return None
    if len(raw) > 200:
        raise InvalidInput(f"{name} is at most 200 characters")
    return raw


def _statuses(raw: str | None) -> list[RecordStatus] | None:
    if raw is None or raw == "":
        return None
    try:
        return [RecordStatus(raw)]
    except ValueError:
        known = ", ".join(s.value for s in RecordStatus)
        raise InvalidInput(f"status must be one of {known}, got {raw!r}") from None
