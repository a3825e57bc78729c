"""The `/reef/*` routes: reports, records, scenarios, releases, rollback, status.

Thin: each route validates its body, calls the state layer, and shapes JSON. The read-only
views the dashboard (`/ui`) needs besides: a scenario's learning curve and a diff between any
two of its releases (its records: `routes_records.py`; its candidates: `routes_candidates.py`).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef import __version__
from reef.commit.scenario_settings import settings_of
from reef.commit.weights_store import release_weights
from reef.core.canonical import check_depth, check_id, check_scenario_name, new_id
from reef.core.errors import InvalidInput, MissingArtifact, NotFound, ReefError
from reef.core.provenance import verified
from reef.core.types import Operation, Report
from reef.serve.inference import parse_json
from reef.serve.openapi_bodies import model_body
from reef.serve.recipe_choice import recipe_bindings


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReportBody(_Body):
    references: list[str] | None = Field(None, description="Receipts this feedback is about (one trajectory)")
    session: str | None = Field(None, description="Instead of references: every record of this x-reef-session")
    score: float = Field(description="A finite number; higher is better", strict=True, allow_inf_nan=False)
    feedback: str | dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    report_id: str | None = Field(None, description="Client-chosen id, for retry safety")


class ScenarioBody(_Body):
    name: str
    recipe: str | None = None
    release_id: str | None = None


class RollbackBody(_Body):
    release_id: str
    expected_head: str | None = None


def validated(model: type[_Body], raw: bytes) -> Any:
    try:
        return model.model_validate(parse_json(raw))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        raise InvalidInput(problems) from None


def build_router() -> APIRouter:
    router = APIRouter(prefix="/reef")

    @router.post("/report", openapi_extra=model_body(ReportBody, "feedback on receipts or a session"))
    async def report(request: Request) -> JSONResponse:
        body: ReportBody = validated(ReportBody, await request.body())
        app = request.app.state.reef
        limits = app.config.limits
        check_depth(body.metadata, limits.max_json_depth, "metadata")
        check_depth(body.feedback, limits.max_json_depth, "feedback")
        if body.references is not None and len(body.references) > limits.max_report_references:
            raise InvalidInput(
                f"a report names at most {limits.max_report_references} receipts, this one "
                f"{len(body.references)} (limits.max_report_references)"
            )
        scenario, references = _report_target(app, body, request.headers.get("x-reef-scenario"))
        report_id = check_id(body.report_id, "report_id") if body.report_id else new_id()
        stored = await app.store.aput_report(
            Report(
                id=report_id,
                scenario=scenario,
                references=tuple(references),
                score=body.score,
                feedback=body.feedback,
                metadata=body.metadata,
            )
        )
        app.metrics.reports.labels(scenario).inc()
        return JSONResponse(
            {"report_id": stored.id, "scenario": scenario, "references": list(stored.references), "score": stored.score}
        )

    @router.get("/records/{record_id}")
    async def record(record_id: str, request: Request) -> JSONResponse:
        store = request.app.state.reef.store
        stored = store.get_record(check_id(record_id, "record id"))
        # JSONResponse, not a returned dict: FastAPI's encoder refuses JSON deeper than ~250 levels
        return JSONResponse(
            {
                "record": stored.to_json(),
                "reports": [r.to_json() for r in store.reports_for(stored.id)],
                "verified": verified(stored),
            }
        )

    @router.get("/scenarios")
    async def scenarios(request: Request) -> dict[str, Any]:
        app = request.app.state.reef
        return {"scenarios": [scenario_summary(app, name) for name in app.state.scenarios()]}

    @router.post("/scenarios", status_code=201, openapi_extra=model_body(ScenarioBody, "a scenario to create"))
    async def create_scenario(request: Request) -> dict[str, Any]:
        body: ScenarioBody = validated(ScenarioBody, await request.body())
        app = request.app.state.reef
        chain = await app.scenarios.create(body.name, body.recipe, body.release_id)
        return scenario_summary(app, chain.scenario)

    @router.get("/scenarios/{name}")
    async def scenario(name: str, request: Request) -> dict[str, Any]:
        return scenario_summary(request.app.state.reef, check_scenario_name(name))

    @router.get("/scenarios/{name}/releases")
    async def releases(name: str, request: Request) -> dict[str, Any]:
        chain = request.app.state.reef.state.chain(check_scenario_name(name))
        head = chain.head().release_id
        return {
            "scenario": name,
            "head": head,
            "releases": await asyncio.to_thread(_releases_json, chain, head),
        }

    @router.get("/scenarios/{name}/decisions")
    async def decisions(name: str, request: Request) -> dict[str, Any]:
        """Every gate verdict of the scenario: published candidates and rejected ones."""
        chain = request.app.state.reef.state.chain(check_scenario_name(name))
        rows = [
            {
                "step": e.step,
                "operation": e.operation.value,
                "release_id": e.release.release_id,
                "content_id": e.metrics.get("candidate_content_id", e.release.content_id),
                "verdict": e.verdict.to_json() if e.verdict else None,
                "metrics": e.metrics,
                "recorded_at": e.recorded_at,
            }
            for e in chain.history()
            if e.operation.value in ("training", "rejection")
        ]
        return {"scenario": name, "decisions": rows}

    @router.get("/scenarios/{name}/curve")
    async def curve(name: str, request: Request) -> dict[str, Any]:
        """Per published release, oldest first: its gate score and the mean reported score of the
        traffic it served."""
        app = request.app.state.reef
        chain = app.state.chain(check_scenario_name(name))
        return {"scenario": name, "releases": await asyncio.to_thread(_curve, app, chain)}

    @router.get("/scenarios/{name}/compare")
    async def compare(name: str, base: str, target: str, request: Request) -> dict[str, Any]:
        """What serving `target` instead of `base` changes: any two releases of the chain (the
        dashboard's preview of a rollback or a promotion against the head)."""
        app = request.app.state.reef
        chain = app.state.chain(check_scenario_name(name))
        old, new = chain.release(check_id(base, "base")), chain.release(check_id(target, "target"))
        changed, text = await asyncio.to_thread(app.state.artifacts.content_diff, old.release_id, new.release_id)
        return {
            "scenario": name,
            "base": old.release_id,
            "target": new.release_id,
            "same_content": old.content_id == new.content_id,
            "changed": changed,
            "diff": text,
        }

    @router.post("/scenarios/{name}/rollback", openapi_extra=model_body(RollbackBody, "the release to republish"))
    async def rollback(name: str, request: Request) -> dict[str, Any]:
        body: RollbackBody = validated(RollbackBody, await request.body())
        app = request.app.state.reef
        chain = app.state.chain(check_scenario_name(name))
        # no expected_head: the chain stacks it on the head of the moment, read under the log's lock
        release = await asyncio.to_thread(
            chain.rollback, check_id(body.release_id, "release_id"), body.expected_head or None
        )
        await app.learning.head_moved(name)  # the canary stops before the answer (its line is not the head's)
        serving = await app.scenarios.serve_release(chain, release)
        return {"release": release.to_json(), "serving": serving.to_json()}

    @router.get("/status")
    async def status(request: Request) -> dict[str, Any]:
        app = request.app.state.reef
        return {
            "version": __version__,
            "serving": {
                "runtime": app.runtime.name,
                "models": app.runtime.served_models(),
                "in_flight": int(app.metrics.in_flight._value.get()),  # noqa: SLF001
                # an engine's resident adapters (runtimes vllm, sglang); null where the runtime lists none
                "adapters": app.runtime.resident_adapters() if hasattr(app.runtime, "resident_adapters") else None,
                # heads this front end cannot read (reef/serve/unreachable.py): what it serves instead
                "unreachable": app.scenarios.unreachable.status(),
            },
            "learning": app.learning.status(),
            "recipes": recipe_bindings(app.state, app.config.recipes, app.runtime),  # per scenario, and why
            "provenance": {
                "runtime_verifies_tokens": app.runtime.verifies_tokens,
                "unverified_records": _counter_total(app.metrics.unverified),
            },
            "storage": {
                "state_dir": str(app.state.root),
                "records": app.store.count_records(),
                "reports": app.store.count_reports(),
                "scenarios": len(app.state.scenarios()),
            },
        }

    return router


def scenario_summary(app: Any, name: str) -> dict[str, Any]:
    chain = app.state.chain(name)
    head = chain.head()
    return {
        "name": name,
        "recipe": chain.binding["recipe"],
        "starting_release_id": chain.binding["starting_release_id"],
        "head": head.to_json(),
        "serving": chain.serving().to_json(),
        "step": chain.last_step(),
        "training_mode": settings_of(chain).training_mode,  # auto, manual or hybrid (routes_train.py)
        "learner": {
            "high_water": chain.high_water(),
            "open_batch": chain.open_batch(),
            "open_batches": chain.open_batches(),
        },
        "records": app.store.count_records(name),
        "reports": app.store.count_reports(name),
    }


def _report_target(app: Any, body: ReportBody, header_scenario: str | None) -> tuple[str, list[str]]:
    if (body.references is None) == (body.session is None):
        raise InvalidInput("a report names either references (receipts) or a session, not both and not neither")
    if body.session is not None:
        scenario = check_scenario_name(header_scenario or "default")
        records = app.store.session_records(scenario, check_id(body.session, "session"))
        if not records:
            raise NotFound(f"session {body.session!r} has no records in scenario {scenario!r}")
        return scenario, [r.id for r in records]
    if not body.references:
        raise InvalidInput("references must name at least one receipt")
    refs = list(
        dict.fromkeys(check_id(r, "reference") for r in body.references)
    )  # each receipt once, first-named order
    if header_scenario:
        return check_scenario_name(header_scenario), refs
    try:
        return app.store.get_record(refs[0]).scenario, refs
    except NotFound:
        raise NotFound(f"unknown receipt {refs[0]}") from None


_KINDS: dict[str, str | None] = {}  # release id -> artifact kind; a release never changes


def _kind(app: Any, release_id: str) -> str | None:
    if release_id not in _KINDS:
        try:
            _KINDS[release_id] = app.state.artifacts.manifest(release_id).kind
        except ReefError:
            return None
    return _KINDS[release_id]


class _Tally:
    """Per release of one scenario: records served and the reports on them, read incrementally
    (reports after `report_cursor`, records after `record_seq`), so a dashboard polling the curve
    does not reread the whole store each time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.report_cursor = 0
        self.record_seq = 0
        self.score_sum: dict[str, float] = {}
        self.reports: dict[str, int] = {}
        self.records: dict[str, int] = {}

    def update(self, store: Any, scenario: str) -> None:
        while True:
            page = store.reported_since(scenario, self.report_cursor, limit=1000)
            for reported in page:
                for rid in {r.release.release_id for r in reported.records if r.release is not None}:
                    self.score_sum[rid] = self.score_sum.get(rid, 0.0) + reported.report.score
                    self.reports[rid] = self.reports.get(rid, 0) + 1
                self.report_cursor = reported.cursor
            if len(page) < 1000:
                break
        for stored in store.iter_records(scenario, after_seq=self.record_seq):
            if stored.record.release is not None:
                rid = stored.record.release.release_id
                self.records[rid] = self.records.get(rid, 0) + 1
            self.record_seq = max(self.record_seq, stored.record.seq or 0)


_TALLIES: weakref.WeakKeyDictionary[Any, dict[str, _Tally]] = weakref.WeakKeyDictionary()
_TALLIES_LOCK = threading.Lock()


def release_tally(app: Any, scenario: str) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
    """Per release id (a canary's `canary-<batch id>` too): the sum of the reported scores of the
    records it served, how many reports, how many records, read on from the last call."""
    with _TALLIES_LOCK:
        tally = _TALLIES.setdefault(app.store, {}).setdefault(scenario, _Tally())
    with tally.lock:
        tally.update(app.store, scenario)
        return dict(tally.score_sum), dict(tally.reports), dict(tally.records)


def _releases_json(chain: Any, head: str) -> list[dict[str, Any]]:
    """Every release, newest first, with the weights it carries ("lora", "full" or null)."""
    rows = []
    for release in chain.releases():
        try:
            weights = release_weights(chain.artifacts, release.release_id)
        except MissingArtifact:  # published by another front end and not reachable now
            weights = None
        rows.append({**release.to_json(), "weights": weights, "current": release.release_id == head})
    return rows


def _curve(app: Any, chain: Any) -> list[dict[str, Any]]:
    """Each published (not pending) release, oldest first: `gate_score` is the gate's mean score
    of its content (its own verdict's `candidate_score`, else the `current_score` a later verdict
    measured it at as the incumbent); `live_mean` the mean score of the reports on records it
    served (a report naming several of its records counts once)."""
    history = chain.history()
    content_of = {e.release.release_id: e.release.content_id for e in history if e.publishes_release}
    measured: dict[str, float] = {}  # content id -> the gate's latest score of it
    for e in history:
        metrics = e.verdict.metrics if e.verdict else {}
        if "candidate_score" not in metrics:
            continue
        if e.operation is Operation.REJECTION:
            candidate, incumbent = e.metrics.get("candidate_content_id"), e.release.content_id
        else:
            candidate, incumbent = e.release.content_id, content_of.get(e.parent_release_id or "")
        if incumbent and metrics.get("current_score") is not None:
            measured[incumbent] = metrics["current_score"]
        if candidate:
            measured[candidate] = metrics["candidate_score"]
    sums, reports, records = release_tally(app, chain.scenario)
    published = [e for e in history if e.publishes_release and not e.pending]
    rows = []
    for i, e in enumerate(published):
        rid = e.release.release_id
        own = e.verdict.metrics.get("candidate_score") if e.verdict else None
        rows.append(
            {
                "release_id": rid,
                "step": e.step,
                "operation": e.operation.value,
                "kind": _kind(app, rid),
                "content_id": e.release.content_id,
                "recorded_at": e.recorded_at,
                "served_until": published[i + 1].recorded_at if i + 1 < len(published) else None,
                "gate_score": own if own is not None else measured.get(e.release.content_id),
                "records": records.get(rid, 0),
                "reports": reports.get(rid, 0),
                "live_mean": sums[rid] / reports[rid] if reports.get(rid) else None,
            }
        )
    return rows


def _counter_total(counter: Any) -> int:
    return int(
        sum(sample.value for metric in counter.collect() for sample in metric.samples if sample.name.endswith("_total"))
    )
