"""OpenTelemetry spans per inference request (the optional `traces` extra), checked in-process
with the SDK's in-memory exporter: the app (`create_app`) in front of a scripted upstream,
driven by starlette's TestClient. One SERVER span per request, named `chat {model}`, with the
GenAI semantic conventions' attributes and Reef's own (`reef.record_id`, `reef.release_id`,
`reef.scenario`); a `traceparent` joins the agent's trace; errors carry `error.type`; prompts and
answers never reach a span. Off by default, and then opentelemetry's SDK is never imported;
with `traces.otlp_endpoint` the spans go out over OTLP/HTTP. Learning is traced on the same
tracer: a harness learner in-process (`skills` on a scripted model) gives `reef.learn` and
`reef.gate` spans with the batch, recipe, decision and gate metrics; the training client's calls
(`reef.train.*`) are children of the candidate's span, and a real weights step on the tiny model
(`sao`) shows them end to end."""

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
from reef.grow.training_client import TrainingClient  # noqa: E402
from reef.observe import spans  # noqa: E402
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
def client(
    exporter: InMemorySpanExporter, upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestClient]:
    """The app with traces on, its tracer on a provider of the test's own: the process's global
    provider stays unset (setting it would switch on FastAPI's own telemetry for every later
    test in this process); the subprocess test below covers the global provider."""
    config = ServeConfig(
        state_dir=tmp_path_factory.mktemp("state"),
        traces={"enabled": True},
        recipes={"default": "skills"},
        learner={"enabled": False},
    )
    runtime = UpstreamRuntime(upstream.base_url, model="provider-model", timeout=5)
    app = create_app(config, runtime)
    assert isinstance(app.state.reef.inference.tracing, Tracing)  # built from the settings
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app.state.reef.inference.tracing = Tracing(provider.get_tracer("reef"), "openai")
    try:
        with TestClient(app, base_url="http://127.0.0.1") as test_client:  # a loopback Host: the server has no token
            yield test_client
    finally:
        spans.configure(None)  # the test's Tracing is never closed: learning spans off for later modules


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
    blob = json.dumps(
        {k: v if isinstance(v, (str, int, float, bool)) else list(v) for k, v in (span.attributes or {}).items()}
    )
    assert PROMPT not in blob and ANSWER not in blob and span.name.count(PROMPT) == 0


def test_a_plain_request_has_one_server_span_with_genai_and_reef_attributes(
    client: TestClient, exporter: InMemorySpanExporter, upstream: ScriptedUpstream
) -> None:
    upstream.script(text=ANSWER, usage=(17, 4), model="provider-model-0613")
    response = client.post(
        "/v1/chat/completions",
        headers={"x-reef-scenario": "traced", "x-reef-session": "conv-1"},
        json={
            "model": "gpt-test",
            "max_tokens": 40,
            "temperature": 0.3,
            "top_p": 0.9,
            "seed": 7,
            "messages": [{"role": "user", "content": PROMPT}],
        },
    )
    assert response.status_code == 200, response.text
    span = only_span(exporter)
    assert span.name == "chat gpt-test" and span.kind is trace.SpanKind.SERVER and span.parent is None
    assert span.status.status_code is trace.StatusCode.UNSET
    attributes = dict(span.attributes or {})
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.request.max_tokens": 40,
        "gen_ai.request.temperature": 0.3,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.seed": 7,
        "gen_ai.conversation.id": "conv-1",
        "gen_ai.response.model": "provider-model-0613",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 17,
        "gen_ai.usage.output_tokens": 4,
        "reef.route": "chat_completions",
        "reef.dialect": "openai",
        "reef.scenario": "traced",
        "reef.stream": False,
        "reef.record_id": response.headers["x-reef-agent-record-id"],
        "reef.release_id": response.headers["x-reef-release-id"],
        "reef.runtime_load_id": attributes["reef.runtime_load_id"],
        "reef.verified": False,
        "http.response.status_code": 200,
    }
    no_text(span)


def test_a_stream_span_ends_with_the_stream_and_joins_the_agents_trace(
    client: TestClient, exporter: InMemorySpanExporter, upstream: ScriptedUpstream
) -> None:
    upstream.script(text=ANSWER + " and more words", usage=(9, 6))
    response = client.post(
        "/v1/messages",
        headers={"traceparent": TRACEPARENT},
        json={
            "model": "claude-test",
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": PROMPT}],
        },
    )
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


def test_refused_and_failed_requests_say_why(
    client: TestClient, exporter: InMemorySpanExporter, upstream: ScriptedUpstream
) -> None:
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
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
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
    with TestClient(app, base_url="http://127.0.0.1") as client:  # a loopback Host: the server has no token
        assert client.post("/v1/chat/completions", headers={{"traceparent": {TRACEPARENT!r}}},
                           json={{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}}).status_code == 200
    return app

app = serve({str(tmp_path / "off")!r})
assert app.state.reef.inference.tracing is None
assert not [m for m in sys.modules if m.startswith("opentelemetry.sdk")], "traces off imported the SDK"
from reef.observe import spans
assert spans.tracer() is None and not spans.enabled()

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


# -- learning: training steps and gate runs -------------------------------------------------------

RULE_MARKER, GOOD, CHATTY = "single word", "4", "Sure! The answer is 4."


@pytest.fixture
def learning_spans() -> Iterator[InMemorySpanExporter]:
    """Learning spans to an in-memory exporter of the test's own (the global provider untouched)."""
    memory, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    spans.configure(provider.get_tracer("reef"))
    try:
        yield memory
    finally:
        spans.configure(None)


def wait_for_span(memory: InMemorySpanExporter, name: str, timeout: float = 60.0) -> ReadableSpan:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [s for s in memory.get_finished_spans() if s.name == name]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no {name} span: {[s.name for s in memory.get_finished_spans()]}")


def test_a_harness_learner_traces_making_and_judging_a_candidate(
    learning_spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """`skills` on a scripted model that answers in the asked form only when a rule says so:
    three reports with the same feedback make a rule, the harness gate selects it on four tasks."""
    from tests.test_harness_learning import write_tasks

    gate = {
        "tasks": str(write_tasks(tmp_path / "tasks.jsonl")),
        "scorer": "tests.test_harness_learning:exact_answer",
        "margin": 1,
    }
    config = ServeConfig(
        state_dir=tmp_path / "state",
        traces={"enabled": True},
        recipes={"scenarios": {"fmt": "skills"}},
        learner={
            "poll_interval": 0.05,
            "skills": {"proposer": "distill", "min_recurrence": 3, "batch_size": 8, "successes": 0, "gate": gate},
        },
    )
    with ScriptedUpstream() as model:
        model.answer_by_system({RULE_MARKER: GOOD}, otherwise=CHATTY)
        ours = spans.tracer()
        app = create_app(config, UpstreamRuntime(model.base_url, model="scripted", timeout=5))
        assert spans.tracer() is app.state.reef.inference.tracing.tracer  # the app's tracer traces learning too
        app.state.reef.inference.tracing = None  # request spans are checked above; here only learning's
        spans.configure(ours)
        with TestClient(app, base_url="http://127.0.0.1") as client:  # a loopback Host: the server has no token
            for feedback in [
                "Answer with a single word only.",
                "Only a single word answer, please.",
                "Answer with a single word only!",
            ]:
                asked = client.post(
                    "/v1/chat/completions",
                    headers={"x-reef-scenario": "fmt"},
                    json={"model": "m", "messages": [{"role": "user", "content": PROMPT}]},
                )
                assert asked.status_code == 200, asked.text
                reported = client.post(
                    "/reef/report",
                    json={"references": [asked.headers["x-reef-agent-record-id"]], "score": 0.0, "feedback": feedback},
                )
                assert reported.status_code == 200, reported.text
            gate_span = wait_for_span(learning_spans, "reef.gate")
            releases = client.get("/reef/scenarios/fmt/releases").json()["releases"]
    learn = wait_for_span(learning_spans, "reef.learn")
    published = next(r for r in releases if r["operation"] == "training")
    batch_id = learn.attributes["reef.batch_id"]  # type: ignore[index]
    assert batch_id in json.dumps(published)  # the batch the published release was trained on
    attributes = dict(gate_span.attributes or {})
    assert {k: attributes[k] for k in ("reef.scenario", "reef.batch_id", "reef.recipe", "reef.gate.decision")} == {
        "reef.scenario": "fmt",
        "reef.batch_id": batch_id,
        "reef.recipe": "skills",
        "reef.gate.decision": "select",
    }
    assert attributes["reef.gate.gate"] == "harness" and attributes["reef.gate.tasks"] == "file"
    assert (attributes["reef.gate.n"], attributes["reef.gate.wins"], attributes["reef.gate.losses"]) == (4, 4, 0)
    assert attributes["reef.gate.candidate_score"] == 1.0 and attributes["reef.gate.current_score"] == 0.0
    assert not any("per_task" in k for k in attributes)  # answers stay off spans
    assert gate_span.status.status_code is trace.StatusCode.UNSET and gate_span.parent is None
    assert dict(learn.attributes or {}) == {
        "reef.scenario": "fmt",
        "reef.batch_id": batch_id,
        "reef.recipe": "skills",
        "reef.surface": "harness",
        "reef.batch.records": 3,
    }
    assert learn.end_time <= gate_span.start_time  # made, then judged
    for span in learning_spans.get_finished_spans():
        no_text(span)


class StubWorker:
    """The training process's answers, for the client's spans only."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call(self, key: str, method: str, *args: object) -> object:
        self.calls.append(method)
        if method == "forward_backward":
            return {"loss": 0.5, "tokens": 12.0}
        if method == "optim_step":
            return {"grad_norm": 0.25, "lr": 0.01}
        if method == "save_state":
            return {"adapter_model.safetensors": b"\0"}
        return {}


def test_training_steps_are_children_of_the_candidates_span(learning_spans: InMemorySpanExporter) -> None:
    import asyncio

    from reef.core.training import AdamParams, Datum

    client = TrainingClient(StubWorker(), "sc")  # type: ignore[arg-type]

    async def candidate() -> None:
        with spans.span("reef.learn", {"reef.scenario": "sc", "reef.batch_id": "b-1", "reef.recipe": "sao"}):
            for _ in range(2):
                await client.forward_backward([Datum([1, 2], [3], [0.0], [1.0], [1.0])] * 3)
                await client.optim_step(AdamParams())
            await client.save_state()

    asyncio.run(candidate())
    finished = learning_spans.get_finished_spans()
    learn = next(s for s in finished if s.name == "reef.learn")
    steps = [s for s in finished if s.name.startswith("reef.train.")]
    assert [s.name for s in steps] == ["reef.train.forward_backward", "reef.train.optim_step"] * 2 + [
        "reef.train.save_state"
    ]
    for step in steps:
        assert step.parent is not None and step.parent.span_id == learn.context.span_id
        assert {k: step.attributes[k] for k in ("reef.scenario", "reef.batch_id", "reef.recipe")} == {  # type: ignore[index]
            "reef.scenario": "sc",
            "reef.batch_id": "b-1",
            "reef.recipe": "sao",
        }
    assert dict(steps[0].attributes or {}) == {
        "reef.scenario": "sc",
        "reef.batch_id": "b-1",
        "reef.recipe": "sao",
        "reef.train.samples": 3,
        "reef.train.loss_fn": "clipped_is",
        "reef.train.loss": 0.5,
        "reef.train.tokens": 12.0,
    }
    assert steps[1].attributes["reef.train.grad_norm"] == 0.25  # type: ignore[index]
    assert "reef.train.adapter_model.safetensors" not in (steps[-1].attributes or {})

    spans.configure(None)  # off: no span, the same answers
    learning_spans.clear()
    assert asyncio.run(client.optim_step(AdamParams())) == {"grad_norm": 0.25, "lr": 0.01}
    assert learning_spans.get_finished_spans() == ()


def test_a_weights_step_on_the_tiny_model_traces_each_training_call_and_the_offline_gate(
    learning_spans: InMemorySpanExporter, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`sao` on the embedded tiny model, in-process: scored traffic until one candidate is judged;
    its `reef.learn` span holds the real training calls (forward_backward, optim_step) as
    children, and its `reef.gate` span the offline gate's drift metrics."""
    from reef.runtimes.factory import build_runtime

    config = ServeConfig(
        state_dir=tmp_path / "state",
        recipes={"scenarios": {"w": "sao"}},
        embedded={"model_dir": str(tiny_model_dir), "default_max_tokens": 4, "threads": 1},
        learner={
            "poll_interval": 0.05,
            "train_threads": 1,
            "sao": {"batch_size": 4, "steps_per_candidate": 1, "lr": 0.01},
            "gate": {"holdout_fraction": 0.5, "offline_bound": 1000.0},
        },
    )
    app = create_app(config, build_runtime(config))
    started = time.monotonic()
    with TestClient(app, base_url="http://127.0.0.1") as client:  # a loopback Host: the server has no token
        sent = 0
        while not [s for s in learning_spans.get_finished_spans() if s.name == "reef.gate"]:
            assert time.monotonic() - started < 90, [s.name for s in learning_spans.get_finished_spans()]
            for _ in range(4):
                asked = client.post(
                    "/v1/chat/completions",
                    headers={"x-reef-scenario": "w"},
                    json={
                        "model": "tiny",
                        "temperature": 1.0,
                        "messages": [{"role": "user", "content": f"Say {sent}."}],
                    },
                )
                assert asked.status_code == 200, asked.text
                client.post(
                    "/reef/report",
                    json={"references": [asked.headers["x-reef-agent-record-id"]], "score": float(sent % 2)},
                )
                sent += 1
            time.sleep(0.2)
    finished = learning_spans.get_finished_spans()
    gate_span = next(s for s in finished if s.name == "reef.gate")
    batch_id = gate_span.attributes["reef.batch_id"]  # type: ignore[index]
    learn = next(s for s in finished if s.name == "reef.learn" and s.attributes["reef.batch_id"] == batch_id)  # type: ignore[index]
    steps = [s for s in finished if s.parent is not None and s.parent.span_id == learn.context.span_id]
    names = [s.name for s in steps]
    assert "reef.train.forward_backward" in names and "reef.train.optim_step" in names, names
    assert names.index("reef.train.forward_backward") < names.index("reef.train.optim_step")
    forward = steps[names.index("reef.train.forward_backward")]
    assert forward.attributes["reef.scenario"] == "w" and forward.attributes["reef.batch_id"] == batch_id  # type: ignore[index]
    assert forward.attributes["reef.recipe"] == "sao" and forward.attributes["reef.train.samples"] == 4  # type: ignore[index]
    assert any(
        isinstance(v, float)
        for k, v in (forward.attributes or {}).items()
        if k.startswith("reef.train.") and k not in ("reef.train.samples",)
    )  # the loss's metrics
    assert learn.attributes["reef.surface"] == "weights"  # type: ignore[index]
    attributes = dict(gate_span.attributes or {})
    assert attributes["reef.recipe"] == "sao" and attributes["reef.scenario"] == "w"
    assert attributes["reef.gate.gate"] == "offline" and attributes["reef.gate.decision"] in ("select", "reject")
    if "reef.gate.reason" not in attributes:  # judged on enough held-out records: the drifts
        assert isinstance(attributes["reef.gate.good_drift"], float) and attributes["reef.gate.bound"] == 1000.0
    print(f"weights step traced in {time.monotonic() - started:.1f}s ({sent} requests)")
