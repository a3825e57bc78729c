"""The request path: admit, freeze the release, run the runtime, record, hand back a receipt.

Plain responses are recorded once, complete (or incomplete with the reason), before the
response goes out: the receipt names a durable record (invariant 1). A stream's record is
written `in_progress` before its first byte, so the receipt in its headers is valid at once,
and finished when the stream ends, fails, or the client goes away or stops reading (a whole
answer is recorded `complete` even if its client left). Every answer that stored a record,
errors included, carries its receipt. The release is frozen when
the request is admitted and pinned until it ends (invariant 8); every generated token carries
the load that produced it, and the record says whether those spans match the frozen release
(invariant 2).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping

import anyio
from starlette.responses import JSONResponse, Response

from reef.config import RequestLimits
from reef.core.canonical import check_depth, check_id, new_id
from reef.core.chat import ChatRequest, ChatResult, Delta, Finish, TextDelta, ToolCall, ToolCallDelta, Usage
from reef.core.errors import InvalidInput, NotFound, RecordConflict, ReefError, RuntimeFailure, StorageUnavailable
from reef.core.provenance import spans_of, verified
from reef.core.types import Record, RecordStatus, ReleaseRef
from reef.observe.store import ExperienceStore
from reef.runtimes.base import Runtime
from reef.serve.dialects import Dialect
from reef.serve.guarded_stream import GuardedStream
from reef.serve.http_errors import status_of
from reef.serve.logs import REQUEST_LOG, emit
from reef.serve.metrics import Metrics
from reef.serve.scenarios import ScenarioDirectory
from reef.serve.tool_policy import WARNING_HEADER, UnsupportedTools
from reef.serve.tool_policy import warning as tool_warning
from reef.surfaces.inject import client_request

if TYPE_CHECKING:  # opentelemetry is imported only when traces are on
    from reef.serve.tracing import RequestSpan, Tracing

TAG_PREFIX = "x-reef-tag-"
log = logging.getLogger("reef.serve")


@dataclass(frozen=True)
class Admission:
    """What the x-reef-* headers ask of one request."""

    scenario: str = "default"
    recipe: str | None = None
    release_id: str | None = None
    session: str | None = None
    record_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    client: str | None = None  # the User-Agent, shown by the dashboard

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], limits: RequestLimits) -> Admission:
        record_id = headers.get("x-reef-agent-record-id")
        tags = _tags(headers, limits)
        return cls(
            scenario=headers.get("x-reef-scenario") or "default",
            recipe=headers.get("x-reef-recipe") or None,
            release_id=headers.get("x-reef-release-id") or None,
            session=_session(headers),
            record_id=check_id(record_id, "x-reef-agent-record-id") if record_id else None,
            tags=tags,
            client=_client(headers),
        )


CLIENT_MAX_CHARS = 200


def _client(headers: Mapping[str, str]) -> str | None:
    """The User-Agent as the record keeps it: printable ASCII, at most CLIENT_MAX_CHARS."""
    agent = "".join(c for c in headers.get("user-agent", "") if " " <= c <= "~").strip()
    return agent[:CLIENT_MAX_CHARS] or None


# Claude Code's, opencode's, Codex CLI's (it sends both of its own, equal for a top-level agent)
AGENT_SESSION_HEADERS = ("x-claude-code-session-id", "x-session-id", "session-id", "thread-id")


def _session(headers: Mapping[str, str]) -> str | None:
    """The record's session: `x-reef-session` (checked: a bad one is a 400), else the session id
    the agent already sends (Claude Code, opencode); an agent's id that is no valid id is left out
    rather than refusing the agent's request."""
    explicit = headers.get("x-reef-session")
    if explicit:
        return check_id(explicit, "x-reef-session")
    for name in AGENT_SESSION_HEADERS:
        value = headers.get(name)
        if value:
            try:
                return check_id(value, name)
            except InvalidInput:
                return None
    return None


def _tags(headers: Mapping[str, str], limits: RequestLimits) -> dict[str, str]:
    tags = {k[len(TAG_PREFIX) :]: v for k, v in headers.items() if k.startswith(TAG_PREFIX)}
    if not tags:
        return tags
    if len(tags) > limits.max_tags:
        raise InvalidInput(f"{len(tags)} x-reef-tag-* headers; at most {limits.max_tags} (limits.max_tags)")
    for name, value in tags.items():
        check_id(name, "x-reef-tag-* name")
        if len(value) > limits.max_tag_bytes:
            raise InvalidInput(
                f"x-reef-tag-{name} is {len(value)} bytes; at most {limits.max_tag_bytes} (limits.max_tag_bytes)"
            )
    return tags


@dataclass(slots=True)
class _Call:
    """One inference request as its log line, metrics and span name it."""

    dialect: Dialect
    route: str
    span: RequestSpan | None = None


class InferenceService:
    def __init__(
        self,
        store: ExperienceStore,
        scenarios: ScenarioDirectory,
        runtime: Runtime,
        metrics: Metrics,
        limits: RequestLimits | None = None,
        tracing: Tracing | None = None,
        unsupported_tools: UnsupportedTools = "drop",
    ) -> None:
        self.unsupported_tools: UnsupportedTools = unsupported_tools
        self.limits = limits or RequestLimits()
        self.store = store
        self.scenarios = scenarios
        self.runtime = runtime
        self.metrics = metrics
        self.tracing = tracing

    async def handle(self, dialect: Dialect, raw_body: bytes, headers: Mapping[str, str], route: str) -> Response:
        if self.tracing is None:
            return await self._handle(_Call(dialect, route), raw_body, headers)
        span = self.tracing.start(route, dialect.name, headers)
        try:
            return await self._handle(_Call(dialect, route, span), raw_body, headers)
        except BaseException as exc:  # refused, failed, or the client left (a no-op if already ended)
            status = status_of(exc) if isinstance(exc, ReefError) else (499 if _cancelled(exc) else 500)
            span.end(status, error=exc.kind if isinstance(exc, ReefError) else type(exc).__name__)
            raise

    async def _handle(self, call: _Call, raw_body: bytes, headers: Mapping[str, str]) -> Response:
        dialect = call.dialect
        body = parse_json(raw_body)
        request = dialect.parse(body, self.unsupported_tools)
        for tool in request.tools:
            check_depth(tool.parameters, self.limits.max_json_depth, f"the schema of tool {tool.name!r}")
        check_depth(request.tool_choice, self.limits.max_json_depth, "tool_choice")
        admission = Admission.from_headers(headers, self.limits)
        retrying = False  # a retry of a failed attempt under the client's receipt: it replaces that record
        if admission.record_id is not None:
            prior = await self._prior_attempt(call, request, admission)
            if isinstance(prior, Response):
                return prior
            retrying = prior
        record_id = admission.record_id or new_id()
        admit = self.scenarios.admit(admission.scenario, admission.recipe, admission.release_id)
        release = await admit.__aenter__()
        try:  # the client's request, with the harness in front in inject mode
            request, harness = await self.scenarios.harness.inject(admission.scenario, request, release)
        except BaseException:
            await admit.__aexit__(None, None, None)
            raise
        record = _new_record(record_id, admission, request, release, harness)
        if call.span is not None:
            call.span.admitted(request, admission.scenario, record_id, release, admission.session)
        if request.stream:
            try:
                return await self._stream(call, body, request, record, release, admit, retrying)
            except BaseException:  # once streaming starts, the stream itself releases the pin
                await admit.__aexit__(None, None, None)
                raise
        try:
            return await self._plain(call, request, record, release, retrying)
        finally:
            await admit.__aexit__(None, None, None)

    # -- plain responses ---------------------------------------------------------------------

    async def _plain(
        self, call: _Call, request: ChatRequest, record: Record, release: ReleaseRef, retrying: bool
    ) -> Response:
        started = time.monotonic()
        result = ChatResult()
        self.metrics.in_flight.inc()
        try:
            async for delta in self.runtime.generate(request, release):
                result.add(delta)
        except RuntimeFailure as exc:  # the model could not answer, or refused (a context overflow): reportable
            await self._save(_finished(record, result, release, self.runtime, started, error=str(exc)), retrying)
            self._count(call, record, exc.status, started, result, error=exc.error_type)
            raise exc.with_headers(_receipt(record, release))
        finally:
            self.metrics.in_flight.dec()
        done = _finished(record, result, release, self.runtime, started)
        await self._save(done, retrying)
        self._count(call, done, 200, started, result)
        return JSONResponse(_body(call.dialect, result, done, request.model), headers=_receipt(record, release))

    # -- streams -----------------------------------------------------------------------------

    async def _stream(
        self,
        call: _Call,
        body: Any,
        request: ChatRequest,
        record: Record,
        release: ReleaseRef,
        admit: Any,
        retrying: bool,
    ) -> Response:
        dialect = call.dialect
        started = time.monotonic()
        deltas = self.runtime.generate(request, release)
        # The runtime starts on the first delta while the in_progress record reaches the disk:
        # the fsync hides behind the time to first token, and no byte goes out before both.
        durable = asyncio.ensure_future(self._write(record, retrying))
        counted = asyncio.ensure_future(self._input_tokens(request) if dialect.counts_input_tokens else _zero())
        try:
            first: Delta | RuntimeFailure | None = await _first_delta(deltas)
        except BaseException as exc:  # a bug or a shutdown: the record must not stay in_progress
            first = RuntimeFailure(f"failed before the first byte ({type(exc).__name__})", status=500)
            raise
        finally:
            with anyio.CancelScope(shield=True):
                written, _ = await asyncio.gather(durable, counted, return_exceptions=True)
                if isinstance(written, BaseException):
                    await deltas.aclose()
                    raise written
                if isinstance(first, RuntimeFailure):  # nothing sent yet: the client gets a plain error
                    await self._finish(
                        _finished(record, ChatResult(), release, self.runtime, started, error=str(first))
                    )
                    self._count(call, record, first.status, started, error=first.error_type)
        if isinstance(first, RuntimeFailure):
            raise first.with_headers(_receipt(record, release))
        if first is not None:  # the first delta is here and the record durable: its bytes go out next
            ttft = time.monotonic() - started
            self.metrics.ttft.labels(call.route, record.scenario).observe(ttft)
            if call.span is not None:
                call.span.first_token(ttft)
        encoder = dialect.stream(body, record.id, request.model, counted.result())
        response: GuardedStream

        async def chunks() -> AsyncIterator[bytes]:
            result = ChatResult()
            self.metrics.in_flight.inc()
            held = b""  # the finish goes out with the closing reef chunk: fewer writes, same bytes
            finished = False
            try:
                opening = encoder.start()
                if first is not None:
                    async for delta in _prepend(first, deltas):
                        result.add(delta)
                        if isinstance(delta, Finish):
                            held += encoder.delta(delta)
                        elif opening:
                            yield opening + encoder.delta(delta)
                            opening = b""
                        else:
                            yield encoder.delta(delta)
                done = _finished(record, result, release, self.runtime, started)
                with anyio.CancelScope(shield=True):  # the answer is whole: record it even if the client left
                    await self._finish(done)
                finished = True
                self._count(call, done, 200, started, result)
                yield (
                    opening
                    + held
                    + encoder.end(
                        {"agent_record_id": record.id, "release_id": release.release_id, "verified": verified(done)}
                    )
                )
            except RuntimeFailure as exc:
                with anyio.CancelScope(shield=True):
                    await self._finish(_finished(record, result, release, self.runtime, started, error=str(exc)))
                finished = True
                self._count(call, record, exc.status, started, result, error=exc.error_type)
                yield opening + held + encoder.error(exc.error_type, str(exc))
            except StorageUnavailable as exc:  # answered, but the record cannot be finished (a full disk): say so
                finished = True
                self._count(call, record, 503, started, result, error=exc.kind)
                kind = "overloaded_error" if dialect.name == "anthropic" else "service_unavailable"
                yield opening + held + encoder.error(kind, f"the answer could not be recorded: {exc}")
            except BaseException:  # the client went away or stalled (cancellation, close) or the server is stopping
                with anyio.CancelScope(shield=True):
                    await deltas.aclose()
                    if not finished:
                        why = response.abandoned or "the stream was stopped before its end (server shutdown)"
                        await self._finish_quietly(_finished(record, result, release, self.runtime, started, error=why))
                        self._log(call, record, 499, time.monotonic() - started, result, "abandoned")
                        if call.span is not None:
                            call.span.end(499, result, error="abandoned")
                raise
            finally:
                self.metrics.in_flight.dec()
                with anyio.CancelScope(shield=True):
                    await admit.__aexit__(None, None, None)

        response = GuardedStream(
            chunks(), {**_receipt(record, release), "cache-control": "no-cache"}, self.limits.stream_send_timeout
        )
        return response

    async def _input_tokens(self, request: ChatRequest) -> int:
        try:
            return await self.runtime.count_tokens(request)
        except RuntimeFailure:
            return 0

    # -- retries with a client-chosen receipt ----------------------------------------------

    async def _prior_attempt(self, call: _Call, request: ChatRequest, admission: Admission) -> Response | bool:
        """What a client-chosen receipt already names. A retry of a complete record answers what
        was recorded; a retry of an `incomplete` one (its attempt failed, or the server stopped
        during it) runs again and replaces it (True; the store refuses if a report names it);
        one while the first attempt is still in progress, or with other content, is a 409.
        False: the receipt is new."""
        assert admission.record_id is not None
        dialect = call.dialect
        try:
            stored = self.store.get_record(admission.record_id)
        except NotFound:
            return False
        asked = {
            "scenario": admission.scenario,
            "request": request.to_json(),
            "session": admission.session,
            "tags": admission.tags,
        }
        had = {
            "scenario": stored.scenario,
            "request": client_request(stored.request, stored.harness),
            "session": stored.session,
            "tags": stored.tags,
        }
        if asked != had:
            raise RecordConflict(f"record {stored.id} already exists with another request")
        if stored.status is RecordStatus.INCOMPLETE:
            return True
        if stored.status is not RecordStatus.COMPLETE or stored.release is None:
            raise RecordConflict(
                f"record {stored.id} is still being answered ({stored.status.value}); retry once "
                "that attempt ends, or with a new x-reef-agent-record-id"
            )
        result = _result_from(stored)
        headers = _receipt(stored, stored.release)
        self._log(call, stored, 200, 0.0, result, replay=True)
        if call.span is not None:
            call.span.admitted(request, stored.scenario, stored.id, stored.release, stored.session)
            call.span.end(200, result)
        if not request.stream:
            return JSONResponse(_body(dialect, result, stored, request.model), headers=headers)
        encoder = dialect.stream({}, stored.id, request.model, result.usage.prompt_tokens)
        events = [
            TextDelta(result.text),
            *(ToolCallDelta(c, i) for i, c in enumerate(result.tool_calls)),
            Finish(result.finish_reason, result.usage, result.model),
        ]
        payload = encoder.start() + b"".join(
            encoder.delta(d) for d in events if not (isinstance(d, TextDelta) and not d.text)
        )
        payload += encoder.end(
            {"agent_record_id": stored.id, "release_id": stored.release.release_id, "verified": verified(stored)}
        )
        return Response(payload, media_type="text/event-stream", headers=headers)

    # -- bookkeeping -------------------------------------------------------------------------

    async def _save(self, record: Record, retrying: bool) -> None:
        await self._write(record, retrying)
        self._count_record(record)

    async def _write(self, record: Record, retrying: bool) -> Record:
        """Store a new record, or, retrying a failed attempt, put it in that attempt's place."""
        if not retrying:
            return await self.store.aput_record(record)
        try:
            return await self.store.areplace_incomplete(record)
        except RecordConflict as exc:
            raise RecordConflict(f"{exc}: retry with a new x-reef-agent-record-id") from None

    async def _finish_quietly(self, record: Record) -> None:
        """Finish a record in a clean-up path, where the first error must not be masked."""
        try:
            await self._finish(record)
        except ReefError as exc:
            log.warning("record %s could not be finished: %s", record.id, exc)

    async def _finish(self, record: Record) -> None:
        await self.store.afinish_record(
            record.id,
            record.status,
            response=record.response,
            token_ids=record.token_ids,
            logprobs=record.logprobs,
            spans=record.spans,
            error=record.error,
            timings=record.timings,
        )
        self._count_record(record)

    def _count_record(self, record: Record) -> None:
        self.metrics.records.labels(record.scenario, record.status.value).inc()
        if record.release and record.status is RecordStatus.COMPLETE and not verified(record):
            self.metrics.unverified.labels(record.scenario).inc()

    def _count(
        self,
        call: _Call,
        record: Record,
        status: int,
        started: float,
        result: ChatResult | None = None,
        error: str | None = None,
    ) -> None:
        """A request ended (answered, or failed with its receipt): metrics, its log line, its span."""
        latency = time.monotonic() - started
        scenario = record.scenario
        self.metrics.requests.labels(call.route, scenario, str(status)).inc()
        self.metrics.latency.labels(call.route, scenario).observe(latency)
        if result is not None and status == 200:
            self.metrics.tokens.labels(scenario, "prompt").inc(result.usage.prompt_tokens)
            self.metrics.tokens.labels(scenario, "completion").inc(result.usage.completion_tokens)
        self._log(call, record, status, latency, result, error)
        if call.span is not None:
            call.span.end(status, result, verified(record) if status == 200 else None, error)

    @staticmethod
    def _log(
        call: _Call,
        record: Record,
        status: int,
        latency: float,
        result: ChatResult | None,
        error: str | None = None,
        replay: bool = False,
    ) -> None:
        """The request's one line at info: ids, names and numbers, never a prompt or an answer."""
        if not REQUEST_LOG.isEnabledFor(logging.INFO):
            return
        usage = result.usage if result is not None else None
        fields: dict[str, Any] = {
            "receipt": record.id,
            "scenario": record.scenario,
            "release_id": record.release.release_id if record.release else None,
            "dialect": call.dialect.name,
            "route": call.route,
            "status": status,
            "latency_ms": round(latency * 1000, 2),
            "prompt_tokens": usage.prompt_tokens if usage else 0,
            "completion_tokens": usage.completion_tokens if usage else 0,
            "stream": bool(record.request.get("stream")) if record.request else False,
        }
        if error is not None:
            fields["error"] = error
        if replay:
            fields["replay"] = True
        emit(REQUEST_LOG, logging.INFO, "request", fields)


async def _first_delta(deltas: AsyncIterator[Delta]) -> Delta | RuntimeFailure | None:
    """The runtime's first delta, its failure, or None when it ends at once."""
    try:
        return await deltas.__anext__()
    except StopAsyncIteration:
        return None
    except RuntimeFailure as exc:
        return exc


async def _prepend(first: Delta, rest: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    yield first
    async for delta in rest:
        yield delta


async def _zero() -> int:
    return 0


def _cancelled(exc: BaseException) -> bool:
    return (
        isinstance(exc, (asyncio.CancelledError, anyio.get_cancelled_exc_class()))
        or type(exc).__name__ == "ClientDisconnect"
    )


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json(raw: bytes) -> Any:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("request body nests arrays and objects too deep to read") from None
    if _SURROGATE_ESCAPE.search(raw):  # only an escape can smuggle in a lone surrogate, which no text can store
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput("request body has an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)") from None
    return value


def _new_record(
    record_id: str,
    admission: Admission,
    request: ChatRequest,
    release: ReleaseRef,
    harness: dict[str, Any] | None = None,
) -> Record:
    return Record(
        id=record_id,
        scenario=admission.scenario,
        release=release,
        request=request.to_json(),
        session=admission.session,
        tags=admission.tags,
        timings={"admitted_at": time.time()},
        harness=harness,
        client=admission.client,
    )


def _finished(
    record: Record, result: ChatResult, release: ReleaseRef, runtime: Runtime, started: float, error: str | None = None
) -> Record:
    status = RecordStatus.INCOMPLETE if error else RecordStatus.COMPLETE
    return record.finished(
        status,
        response=result.response_json(),
        token_ids=list(result.token_ids) if runtime.verifies_tokens else None,
        logprobs=list(result.logprobs) if runtime.verifies_tokens else None,
        spans=spans_of(result.token_loads),
        error=error,
        timings={**record.timings, "duration_s": round(time.monotonic() - started, 6)},
    )


def _body(dialect: Dialect, result: ChatResult, record: Record, model: str) -> dict[str, Any]:
    """A plain response body, with the receipt under `reef` where the dialect carries one there."""
    body = dialect.response(result, record.id, model)
    if dialect.receipt_in_body and record.release is not None:
        body["reef"] = {
            "agent_record_id": record.id,
            "release_id": record.release.release_id,
            "verified": verified(record),
        }
    return body


def _receipt(record: Record, release: ReleaseRef) -> dict[str, str]:
    headers = {"x-reef-agent-record-id": record.id, "x-reef-release-id": release.release_id}
    if record.request.get("dropped_tools"):
        headers[WARNING_HEADER] = tool_warning(record.request["dropped_tools"])
    return headers


def _result_from(record: Record) -> ChatResult:
    response = record.response or {}
    usage = response.get("usage") or {}
    return ChatResult(
        text=response.get("text", ""),
        tool_calls=[ToolCall(c["id"], c["name"], c["arguments"]) for c in response.get("tool_calls", [])],
        finish_reason=response.get("finish_reason", "stop"),
        usage=Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)),
        model=response.get("model"),
    )
