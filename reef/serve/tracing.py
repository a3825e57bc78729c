"""OpenTelemetry spans, one per inference request (optional: `pip install 'reef-serve[traces]'`).

Off by default, and then free: nothing imports `opentelemetry` (this module imports it only in
`build`), and the request path checks one attribute. On (`traces.enabled: true`, or
`traces.otlp_endpoint` set), each request to `/v1/chat/completions`, `/v1/messages` or
`/v1/responses` gets one span named `chat {model}` that follows the OpenTelemetry GenAI
semantic conventions (`gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.*`,
`gen_ai.response.model`, `gen_ai.response.finish_reasons`, `gen_ai.usage.input_tokens`,
`gen_ai.usage.output_tokens`, `gen_ai.conversation.id`, `error.type`) plus Reef's own
(`reef.record_id`, `reef.release_id`, `reef.scenario`, `reef.runtime_load_id`, `reef.dialect`,
`reef.route`, `reef.stream`, `reef.verified`, `reef.time_to_first_token_s`) and
`http.response.status_code`. Prompts and answers are never put on a span. Its kind is SERVER
(a `traceparent` header from the agent makes it a child of the agent's span), or INTERNAL when
an HTTP server span is already current: FastAPI makes one on its own for every request when the
process's global tracer provider is configured, and then that span is the server side.

Export: OTLP over HTTP to `traces.otlp_endpoint`, else to `OTEL_EXPORTER_OTLP_ENDPOINT` /
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` when set (the exporter reads them), through a batching
processor on its own thread. With neither, Reef uses the process's global tracer provider, so an
application that embeds Reef (or a test, with the SDK's in-memory exporter) sees the spans.

Learning is traced too, on the same tracer: `build` hands it to `reef.observe.spans`, through
which the learner opens `reef.learn` (making one candidate), the training client
`reef.train.{forward_backward,optim_step,load_state,save_state}` (its children, one per call into
the training process) and the learner `reef.gate` (judging and settling one candidate), each
with `reef.scenario`, `reef.batch_id` and `reef.recipe`; `close` turns them off again. That
tracer is process-wide: one traced app per process.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from reef.config import TracesConfig
from reef.core.errors import InvalidInput
from reef.observe import spans

ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class Tracing:
    """Starts request spans; built by `build` only when traces are on."""

    def __init__(self, tracer: Any, provider_name: str, processor: Any = None) -> None:
        from opentelemetry import propagate, trace

        self.tracer = tracer
        self.provider_name = provider_name
        self.processor = processor  # owned here (OTLP): flushed and shut down by `close`
        spans.configure(tracer)  # learning spans (reef.grow, reef.commit) go to the same tracer
        self._extract = propagate.extract
        self._current = trace.get_current_span
        self._server, self._internal = trace.SpanKind.SERVER, trace.SpanKind.INTERNAL
        self._error = trace.Status(trace.StatusCode.ERROR)

    def start(self, route: str, dialect: str, headers: Mapping[str, str]) -> RequestSpan:
        if self._current().is_recording():  # inside an HTTP server span (FastAPI's, on a global provider)
            kind, context = self._internal, None
        else:  # Reef's span is the server side of the agent's call
            kind, context = self._server, (self._extract(headers) if "traceparent" in headers else None)
        span = self.tracer.start_span(
            "chat",
            context=context,
            kind=kind,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self.provider_name,
                "reef.route": route,
                "reef.dialect": dialect,
            },
        )
        return RequestSpan(span, self._error)

    def close(self) -> None:
        if spans.tracer() is self.tracer:
            spans.configure(None)
        if self.processor is not None:
            self.processor.shutdown()  # flushes what is queued


class RequestSpan:
    """One request's span: named and described as the request is admitted, ended exactly once."""

    __slots__ = ("span", "_error", "ended")

    def __init__(self, span: Any, error_status: Any) -> None:
        self.span = span
        self._error = error_status
        self.ended = False

    def admitted(self, request: Any, scenario: str, record_id: str, release: Any, session: str | None) -> None:
        span = self.span
        span.update_name(f"chat {request.model}")
        attributes: dict[str, Any] = {
            "gen_ai.request.model": request.model,
            "reef.scenario": scenario,
            "reef.record_id": record_id,
            "reef.release_id": release.release_id,
            "reef.stream": bool(request.stream),
        }
        if release.runtime_load_id is not None:
            attributes["reef.runtime_load_id"] = release.runtime_load_id
        for key, value in (
            ("gen_ai.request.max_tokens", request.max_tokens),
            ("gen_ai.request.temperature", request.temperature),
            ("gen_ai.request.top_p", request.top_p),
            ("gen_ai.request.seed", request.seed),
            ("gen_ai.conversation.id", session),
        ):
            if value is not None:
                attributes[key] = value
        span.set_attributes(attributes)

    def first_token(self, seconds: float) -> None:
        self.span.set_attribute("reef.time_to_first_token_s", round(seconds, 6))

    def end(self, status: int, result: Any = None, verified: bool | None = None, error: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        span = self.span
        attributes: dict[str, Any] = {"http.response.status_code": status}
        if result is not None:
            attributes["gen_ai.usage.input_tokens"] = result.usage.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = result.usage.completion_tokens
            attributes["gen_ai.response.finish_reasons"] = (result.finish_reason,)
            if result.model:
                attributes["gen_ai.response.model"] = result.model
        if verified is not None:
            attributes["reef.verified"] = verified
        if error is not None or status >= 500:
            attributes["error.type"] = error or str(status)
        if status >= 500:  # a client's own mistake (4xx) is no error of a server span
            span.set_status(self._error)
        span.set_attributes(attributes)
        span.end()


def build(settings: TracesConfig, runtime: Any) -> Tracing | None:
    """The request tracer the settings ask for, or None (then nothing here is ever imported)."""
    if not settings.on:
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        raise InvalidInput(
            "traces are on, but OpenTelemetry is not installed: pip install 'reef-serve[traces]'"
        ) from None
    provider_name = _provider_name(runtime)
    endpoint = settings.otlp_endpoint or next((os.environ[k] for k in ENDPOINT_ENV if os.environ.get(k)), None)
    if endpoint is None:  # the embedding process's provider (a no-op one unless it set one)
        return Tracing(trace.get_tracer("reef"), provider_name)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise InvalidInput(
            f"traces go to {endpoint}, but the OTLP exporter is not installed: pip install 'reef-serve[traces]'"
        ) from None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # service.name "reef" unless the standard OTEL_SERVICE_NAME names another
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "reef"}))
    traces_url = settings.otlp_endpoint and settings.otlp_endpoint.rstrip("/") + "/v1/traces"
    processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url) if traces_url else OTLPSpanExporter())
    provider.add_span_processor(processor)
    return Tracing(provider.get_tracer("reef"), provider_name, processor)


def _provider_name(runtime: Any) -> str:
    """`gen_ai.provider.name`: the upstream's API (`openai`, `anthropic`), or `reef` for the
    embedded model Reef runs itself."""
    if getattr(runtime, "name", None) == "upstream":
        return str(getattr(runtime, "dialect", "openai"))
    return "reef"
