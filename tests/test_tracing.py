"""OpenTelemetry spans per inference request (the optional `traces` extra), checked in-process
with the SDK's in-memory exporter: the app (`create_app`) in front of a scripted upstream,
driven by starlette's TestClient. One SERVER span per request, named `chat {model}`, with the
GenAI semantic conventions' attributes and Reef's own (`reef.record_id`, `reef.release_id`,
`reef.scenario`); a `traceparent` joins the agent's trace; errors carry `error.type`; prompts and
answers never reach a span. Off by default, and then opentelemetry's SDK is never imported;
with `traces.otlp_endpoint` the spans go out over OTLP/HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the traces extra: pip install 'reef-serve[traces]'")

from fastapi.testclient import TestClient  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from reef.config import ServeConfig  # noqa: E402
from reef.runtimes.upstream import UpstreamRuntime  # noqa: E402
from reef.serve.app import create_app  # noqa: E402
from reef.serve.tracing import Tracing  # noqa: E402
from tests.scripted_upstream import ScriptedUpstream  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "span-prompt-marker-41b7"
ANSWER = "span-answer-marker-c09e"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def client(exporter: InMemorySpanExporter, upstream: ScriptedUpstream,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The app with traces on, its tracer on a provider of the test's own: the process's global
    provider stays unset (setting it would switch on FastAPI's own telemetry for every later
    test in this process); the subprocess test below covers the global provider."""
    config = ServeConfig(state_dir=tmp_path_factory.mktemp("state"), traces={"enabled": True},
                         recipes={"default": "skills"}, learner={"enabled": False})
    runtime = UpstreamRuntime(upstream.base_url, model="provider-model", timeout=5)
    app = create_app(config, runtime)
    assert isinstance(app.state.reef.inference.tracing, Tracing)  # built from the settings
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app.state.reef.inference.tracing = Tracing(provider.get_tracer("reef"), "openai")
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture(autouse=True)
def fresh(exporter: InMemorySpanExporter, upstream: ScriptedUpstream) -> None:
    exporter.clear()
    upstream.clear()


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    deadline = time.monotonic() + 5
    while not exporter.get_finished_spans() and time.monotonic() < deadline:
        time.sleep(0.01)
    spans = exporter.get_finished_spans()
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def no_text(span: ReadableSpan) -> None:
    blob = json.dumps({k: v if isinstance(v, (str, int, float, bool)) else list(v)
                       for k, v in (span.attributes or {}).items()})
    assert PROMPT not in blob and ANSWER not in blob and span.name.count(PROMPT) == 0


def test_a_plain_request_has_one_server_span_with_genai_and_reef_attributes(
        client: TestClient, exporter: InMemorySpanExporter, upstream: ScriptedUpstream) -> None:
    upstream.script(text=ANSWER, usage=(17, 4), model="provider-model-0613")
    response = client.post("/v1/chat/completions", headers={"x-reef-scenario": "traced", "x-reef-session": "conv-1"},
                           json={"model": "gpt-test", "max_tokens": 40, "temperature": 0.3, "top_p": 0.9, "seed": 7,
                                 "messages": [{"role": "user", "content": PROMPT}]})
    assert response.status_code == 200, response.text
    span = only_span(exporter)
    assert span.name == "chat gpt-test" and span.kind is trace.SpanKind.SERVER and span.parent is None
    assert span.status.status_code is trace.StatusCode.UNSET
    attributes = dict(span.attributes or {})
    assert attributes == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-test",
        "gen_ai.request.max_tokens": 40, "gen_ai.request.temperature": 0.3, "gen_ai.request.top_p": 0.9,
        "gen_ai.request.seed": 7, "gen_ai.conversation.id": "conv-1",
        "gen_ai.response.model": "provider-model-0613", "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 17, "gen_ai.usage.output_tokens": 4,
        "reef.route": "chat_completions", "reef.dialect": "openai", "reef.scenario": "traced", "reef.stream": False,
        "reef.record_id": response.headers["x-reef-agent-record-id"],
        "reef.release_id": response.headers["x-reef-release-id"],
        "reef.runtime_load_id": attributes["reef.runtime_load_id"], "reef.verified": False,
        "http.response.status_code": 200}
    no_text(span)


def test_a_stream_span_ends_with_the_stream_and_joins_the_agents_trace(
        client: TestClient, exporter: InMemorySpanExporter, upstream: ScriptedUpstream) -> None:
    upstream.script(text=ANSWER + " and more words", usage=(9, 6))
    response = client.post("/v1/messages", headers={"traceparent": TRACEPARENT},
                           json={"model": "claude-test", "max_tokens": 50, "stream": True,
                                 "messages": [{"role": "user", "content": PROMPT}]})
    assert response.status_code == 200 and "message_stop" in response.text
    span = only_span(exporter)
    attributes = dict(span.attributes or {})
    assert span.name == "chat claude-test"
    assert format(span.context.trace_id, "032x") == TRACE_ID  # a child of the agent's span
    assert span.parent is not None and format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert attributes["reef.stream"] is True and attributes["reef.dialect"] == "anthropic"
    assert attributes["gen_ai.usage.output_tokens"] == 6 and attributes["reef.time_to_first_token_s"] > 0
    assert attributes["reef.record_id"] == response.headers["x-reef-agent-record-id"]
    assert attributes["reef.scenario"] == "default" and attributes["http.response.status_code"] == 200
    no_text(span)


def test_refused_and_failed_requests_say_why(client: TestClient, exporter: InMemorySpanExporter,
                                             upstream: ScriptedUpstream) -> None:
    refused = client.post("/v1/chat/completions", json={"model": "m", "messages": PROMPT})
    assert refused.status_code == 400
    span = only_span(exporter)
    assert span.name == "chat"  # refused before the model was read
    assert span.attributes["error.type"] == "invalid_request_error"  # type: ignore[index]
    assert span.attributes["http.response.status_code"] == 400  # type: ignore[index]
    assert span.status.status_code is trace.StatusCode.UNSET  # the client's mistake, not the server's
    assert "reef.record_id" not in (span.attributes or {})
    no_text(span)

    exporter.clear()
    upstream.script(status=503, error="the provider is down")
    failed = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": PROMPT}]})
    assert failed.status_code == 502
    span = only_span(exporter)
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.attributes["error.type"] == "upstream_error"  # type: ignore[index]
    assert span.attributes["reef.record_id"] == failed.headers["x-reef-agent-record-id"]  # type: ignore[index]


def test_traces_off_import_no_sdk_and_an_otlp_endpoint_gets_the_spans(
        upstream: ScriptedUpstream, tmp_path: Path) -> None:
    """In a fresh interpreter: with traces off, serving imports no opentelemetry SDK; with the
    process's global tracer provider set (an application embedding Reef), FastAPI's own HTTP
    span is the SERVER span and Reef's is its INTERNAL child, in the agent's trace; with
    `traces.otlp_endpoint`, a request's span is posted to `<endpoint>/v1/traces` (flushed at
    shutdown)."""
    script = f"""
import sys
from fastapi.testclient import TestClient
from reef.config import ServeConfig
from reef.runtimes.upstream import UpstreamRuntime
from reef.serve.app import create_app

def serve(state, tracing=None, **traces):
    app = create_app(ServeConfig(state_dir=state, traces=traces, learner={{"enabled": False}}),
                     UpstreamRuntime({upstream.base_url!r}, model="m", timeout=5))
    if tracing is not None:
        app.state.reef.inference.tracing = tracing
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", headers={{"traceparent": {TRACEPARENT!r}}},
                           json={{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}}).status_code == 200
    return app

app = serve({str(tmp_path / "off")!r})
assert app.state.reef.inference.tracing is None
assert not [m for m in sys.modules if m.startswith("opentelemetry.sdk")], "traces off imported the SDK"

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
memory, provider = InMemorySpanExporter(), TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(provider)
serve({str(tmp_path / "global")!r}, enabled=True)
ours = [s for s in memory.get_finished_spans() if s.instrumentation_scope.name == "reef"]
http = [s for s in memory.get_finished_spans() if s.kind is trace.SpanKind.SERVER]
assert len(ours) == 1 and len(http) == 1, memory.get_finished_spans()
assert ours[0].kind is trace.SpanKind.INTERNAL and ours[0].name == "chat m"
assert ours[0].parent.span_id == http[0].context.span_id
assert format(ours[0].context.trace_id, "032x") == {TRACE_ID!r}

serve({str(tmp_path / "on")!r}, otlp_endpoint={upstream.root_url!r})
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("POST", "/v1/traces") in upstream.app.hits
