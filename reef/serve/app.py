"""The ASGI app: state, runtime, routes, guards, lifespan.

`create_app(config, runtime)` builds everything from one `ServeConfig`; tests pass a runtime
they built (the tiny model, an upstream pointed at a scripted provider).
"""

from __future__ import annotations

import os
import socket
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from reef import __version__
from reef.commit.commit_log import JsonlCommitLogs
from reef.commit.file_leases import FileLeases
from reef.commit.state import ReefState
from reef.config import ServeConfig
from reef.core.errors import ReefError
from reef.observe.store import ExperienceStore
from reef.runtimes.base import Runtime
from reef.serve import (
    routes_archive,
    routes_candidates,
    routes_harness,
    routes_import,
    routes_install,
    routes_records,
    routes_reef,
    routes_scenario_config,
    routes_train,
    routes_v1,
)
from reef.serve.auth import TokenAuth
from reef.serve.body_limit import BodyLimit
from reef.serve.cross_site import JsonBodies, LoopbackOnly, own_hosts
from reef.serve.hot_routes import HOT, HotRoutes
from reef.serve.http_errors import error_response, reef_error_handler
from reef.serve.inference import InferenceService
from reef.serve.learning import Learning, Leases
from reef.serve.logs import RequestLog
from reef.serve.metrics import Metrics
from reef.serve.scenarios import HeadFollower, ScenarioDirectory
from reef.serve.tracing import build as build_tracing
from reef.ui import Dashboard


@dataclass
class ReefApp:
    """What every route reaches through `request.app.state.reef`."""

    config: ServeConfig
    state: ReefState
    store: ExperienceStore
    runtime: Runtime
    scenarios: ScenarioDirectory
    inference: InferenceService
    metrics: Metrics
    learning: Learning


def open_store(config: ServeConfig) -> ExperienceStore | None:
    if config.store == "sqlite":
        return None  # ReefState opens the SQLite store in the state directory
    if config.store.startswith(("postgresql://", "postgres://")):
        from reef.observe.postgres_store import PostgresStore

        return PostgresStore(config.store)
    raise ReefError(f"store must be 'sqlite' or a postgresql:// DSN, got {config.store!r}")


def create_app(
    config: ServeConfig, runtime: Runtime, on_ready: Callable[[ReefApp], Awaitable[None]] | None = None
) -> FastAPI:
    """The app; `on_ready` runs once everything started, before the server says it is ready."""
    tracing = build_tracing(config.traces, runtime)  # None when off: then opentelemetry is never imported
    state = ReefState.open(
        config.state_dir,
        store=open_store(config),
        artifacts_remote=config.artifacts.remote,
        shared=config.shared_state_dir,
    )
    metrics = Metrics()
    scenarios = ScenarioDirectory(state, runtime, config.recipes, config.harness, config.limits.max_scenarios)
    front_end = f"{socket.gethostname()}:{config.port} pid {os.getpid()}"  # how other front ends name this one
    learning = Learning(config.learner, state, runtime, scenarios, _leases(state, front_end), front_end)
    # a commit log others append to (PostgreSQL, a shared state directory): serve whatever head they publish
    follower = HeadFollower(state, scenarios) if getattr(state.commit_logs, "shared", False) else None
    metrics.watch_runtime(runtime)
    metrics.watch_learning(learning.status)
    metrics.watch_unreachable(scenarios.unreachable.count)
    reef = ReefApp(
        config,
        state,
        state.store,
        runtime,
        scenarios,
        InferenceService(state.store, scenarios, runtime, metrics, config.limits, tracing, config.unsupported_tools),
        metrics,
        learning,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        await scenarios.start()
        await learning.start()
        if follower is not None:
            follower.start()
        if on_ready is not None:
            await on_ready(reef)
        try:
            yield
        finally:
            if follower is not None:
                await follower.close()
            await learning.close()
            await runtime.close()
            state.close()
            if tracing is not None:
                tracing.close()

    app = FastAPI(title="Reef", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.reef = reef
    app.add_exception_handler(ReefError, reef_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    app.include_router(routes_v1.build_router())
    app.include_router(routes_reef.build_router())
    app.include_router(routes_records.build_router())
    app.include_router(routes_candidates.build_router())
    app.include_router(routes_harness.build_router())
    app.include_router(routes_install.build_router())
    app.include_router(routes_import.build_router())
    app.include_router(routes_archive.build_router())
    app.include_router(routes_train.build_router())
    app.include_router(routes_scenario_config.build_router())

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        problem = state.store.health()
        if problem is not None:
            return JSONResponse({"status": "failing", "reason": problem}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    app.add_middleware(HotRoutes, service=reef.inference)  # innermost: after the guards below
    app.add_middleware(
        BodyLimit,
        max_bytes=config.max_body_bytes,
        max_header_bytes=config.limits.max_header_bytes,
        routes={routes_import.BATCH_PATH: routes_import.body_limit(config.max_body_bytes)},
    )
    app.add_middleware(JsonBodies)  # inside the token check: a request without the token still gets 401
    app.add_middleware(TokenAuth, tokens=config.tokens)
    app.add_middleware(Dashboard)  # outside the token check: /ui's static files hold no data
    if not config.tokens:  # a browser never adds a token: without one, refuse what another site could send
        app.add_middleware(LoopbackOnly, own_hosts=own_hosts(config), check_host=not config.insecure)
    app.add_middleware(RequestLog, hot=HOT)  # outermost: a request refused by any guard gets its line too
    return app


def _leases(state: ReefState, front_end: str) -> Leases | None:
    """Learner leases where front ends share the commit log: one learner per scenario across the
    deployment, by an advisory lock on PostgreSQL, by a file lock on a shared state directory.
    None for one process on its own state directory: it runs every learner."""
    if not getattr(state.commit_logs, "shared", False):
        return None
    if isinstance(state.commit_logs, JsonlCommitLogs):
        return FileLeases(state.root / "leases", front_end)
    from reef.commit.leases import PgLeases

    logs = state.commit_logs
    return PgLeases(logs.dsn, logs.schema, front_end)  # type: ignore[attr-defined]


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return error_response(request.url.path, exc.status_code, str(exc.detail))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    return error_response(request.url.path, 500, f"internal error: {type(exc).__name__}")
