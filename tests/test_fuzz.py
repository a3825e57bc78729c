"""Fuzzing with schemathesis against Reef's own OpenAPI schema: every `/reef/*` and `/v1/*`
operation (read from `/openapi.json`, so a new route is fuzzed the day it is added), served by
the embedded tiny model, gets schema-conforming and schema-violating requests. Checks: no 5xx,
no hang, and a rejected (4xx) request changes nothing (records, reports, scenarios, releases)
but the one `incomplete` record its receipt names when the model itself refused it."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Iterator

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode

from tests.helpers.reef_server import ReefServer

TOKEN = "fuzz-token-0c4f"
AUTH = {"authorization": f"Bearer {TOKEN}"}
SCALE = int(os.environ.get("REEF_FUZZ_SCALE", "1"))  # more examples for a deeper run off CI
EXAMPLES = {GenerationMode.POSITIVE: 8 * SCALE, GenerationMode.NEGATIVE: 5 * SCALE}
REQUEST_TIMEOUT = 30.0  # a request that takes longer is a hang
MAX_GENERATED_TOKENS = 8  # keeps the tiny model's answers short; the limit itself is not under test
FUZZED_PREFIXES = ("/reef/", "/v1/")


@pytest.fixture(scope="module")
def reef(tiny_model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings_ = {
        "tokens": [TOKEN],
        "learner": {"enabled": False},
        "max_body_bytes": 256 * 1024,
        "embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": MAX_GENERATED_TOKENS, "threads": 1},
    }
    with ReefServer(tmp_path_factory.mktemp("reef-fuzz"), settings_) as server:
        seeded = httpx.post(
            f"{server.base_url}/chat/completions",
            headers=AUTH,
            timeout=60,
            json={"model": "m", "messages": [{"role": "user", "content": "seed"}], "max_tokens": 2},
        )
        assert seeded.status_code == 200  # one scenario, record and release for reads to find
        yield server


def snapshot(reef: ReefServer) -> dict[str, Any]:
    """Everything a request could change, as counts and heads."""
    with httpx.Client(base_url=reef.url, headers=AUTH, timeout=REQUEST_TIMEOUT) as http:
        storage = http.get("/reef/status").json()["storage"]
        scenarios = {
            s["name"]: (s["step"], s["head"]["release_id"], s["records"], s["reports"])
            for s in http.get("/reef/scenarios").json()["scenarios"]
        }
    return {"records": storage["records"], "reports": storage["reports"], "scenarios": scenarios}


def receipt_of(response: Any) -> str | None:
    """The receipt a fuzzed call's answer carries (schemathesis gives each header as a list)."""
    value = response.headers.get("x-reef-agent-record-id")
    return value[0] if isinstance(value, list) else value


def expected_after_refusal(reef: ReefServer, before: dict[str, Any], receipt: str | None) -> dict[str, Any]:
    """A 4xx changes nothing, except that a refusal by the model itself (a prompt beyond its
    context) is recorded as one `incomplete` record, named by the receipt it carries."""
    if receipt is None:
        return before
    record = httpx.get(f"{reef.url}/reef/records/{receipt}", headers=AUTH, timeout=REQUEST_TIMEOUT).json()["record"]
    assert record["status"] == "incomplete", record
    step, head, records, reports = before["scenarios"][record["scenario"]]
    return {
        **before,
        "records": before["records"] + 1,
        "scenarios": {**before["scenarios"], record["scenario"]: (step, head, records + 1, reports)},
    }


def bounded(case: schemathesis.Case) -> None:
    """Cap generation lengths so a fuzzed request finishes in milliseconds on the tiny model."""
    if isinstance(case.body, dict):
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if isinstance(case.body.get(key), int) and not isinstance(case.body.get(key), bool) and case.body[key] > 0:
                case.body[key] = min(case.body[key], MAX_GENERATED_TOKENS)


def fuzzed_operations(reef: ReefServer) -> list[Any]:
    schema = schemathesis.openapi.from_dict(httpx.get(f"{reef.url}/openapi.json", headers=AUTH).json())
    operations = [result.ok() for result in schema.get_all_operations()]
    return [op for op in operations if op.path.startswith(FUZZED_PREFIXES)]


def fuzz_one(reef: ReefServer, operation: Any, mode: GenerationMode, failures: list[str]) -> int:
    session = requests.Session()
    calls = 0

    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        nonlocal calls
        bounded(case)
        before = snapshot(reef)
        started = time.monotonic()
        try:
            response = case.call(base_url=reef.url, session=session, headers=AUTH, timeout=REQUEST_TIMEOUT)
        except requests.Timeout:
            failures.append(f"{operation.label} ({mode}): no answer in {REQUEST_TIMEOUT}s to {case.body!r}")
            return
        calls += 1
        where = f"{operation.label} ({mode}) {case.path_parameters or ''} {case.query or ''} body={case.body!r:.300}"
        if response.status_code >= 500:
            failures.append(f"{where} -> {response.status_code} {response.text[:300]}")
        elif 400 <= response.status_code < 500:
            after = snapshot(reef)
            if after != expected_after_refusal(reef, before, receipt_of(response)):
                failures.append(
                    f"{where} -> {response.status_code} {response.text[:300]} yet the state changed: "
                    f"{before} -> {after}"
                )
        assert time.monotonic() - started < REQUEST_TIMEOUT

    try:
        run()
    except Unsatisfiable:
        if mode is GenerationMode.POSITIVE:
            raise
        # an operation without parameters or body has nothing a request could violate
    return calls


def test_the_openapi_schema_describes_every_request_body(reef: ReefServer) -> None:
    schema = httpx.get(f"{reef.url}/openapi.json", headers=AUTH).json()
    for path, item in schema["paths"].items():
        if "post" in item:
            body = item["post"].get("requestBody", {}).get("content", {}).get("application/json", {})
            assert body.get("schema"), f"POST {path} declares no JSON body"


def test_fuzzing_finds_no_server_error_hang_or_state_change_from_a_rejection(reef: ReefServer) -> None:
    operations = fuzzed_operations(reef)
    labels = {op.label for op in operations}
    assert {
        "POST /v1/chat/completions",
        "POST /v1/messages",
        "POST /reef/report",
        "GET /reef/records/{record_id}",
        "POST /reef/scenarios/{name}/rollback",
    } <= labels
    failures: list[str] = []
    calls = sum(fuzz_one(reef, op, mode, failures) for op in operations for mode in EXAMPLES)
    assert not failures, "\n".join(failures[:20])
    assert calls >= len(operations) * 4, "the fuzzer should reach the operations several times each"
    assert httpx.get(f"{reef.url}/healthz").status_code == 200


def test_a_prompt_longer_than_the_context_is_a_400_with_a_receipt_to_report_on(reef: ReefServer) -> None:
    long_prompt = "word " * 5000  # beyond the tiny model's 2048-token context
    for path, body in [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": long_prompt}]}),
        ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": long_prompt}]}),
    ]:
        receipt = f"too-long-{path.rsplit('/', 1)[1]}"
        refused = httpx.post(
            f"{reef.url}{path}", json=body, headers={**AUTH, "x-reef-agent-record-id": receipt}, timeout=REQUEST_TIMEOUT
        )
        assert refused.status_code == 400 and "context" in refused.text
        assert refused.headers["x-reef-agent-record-id"] == receipt
        record = httpx.get(f"{reef.url}/reef/records/{receipt}", headers=AUTH).json()["record"]
        assert record["status"] == "incomplete" and "context" in record["error"]
        reported = httpx.post(f"{reef.url}/reef/report", json={"references": [receipt], "score": 0}, headers=AUTH)
        assert reported.status_code == 200


def test_extreme_sampling_values_are_answered_and_fail_no_neighbour(reef: ReefServer) -> None:
    """Values inside the schema that once broke the embedded runtime: a seed beyond 64 bits
    (a 500), a temperature so small that logits / temperature overflows (NaN probabilities,
    which failed every request batched with it)."""
    user = [{"role": "user", "content": "hi"}]
    odd = [
        {"seed": 2**70},
        {"seed": -(2**70)},
        {"temperature": 1e-300},
        {"temperature": 5e-324, "top_p": 1e-300},
        {"seed": 2**70, "stream": True},
    ]

    async def all_at_once() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=reef.base_url, headers=AUTH, timeout=REQUEST_TIMEOUT) as http:
            bodies = [{"model": "m", "messages": user, "max_tokens": 4, **extra} for extra in odd]
            bodies += [{"model": "m", "messages": user, "max_tokens": 4}] * 4  # neighbours in the same batch
            return list(await asyncio.gather(*(http.post("/chat/completions", json=b) for b in bodies)))

    for response in asyncio.run(all_at_once()):
        assert response.status_code == 200, response.text
        assert '"error"' not in response.text[-300:]
    anthropic_tiny = httpx.post(
        f"{reef.url}/v1/messages",
        headers=AUTH,
        timeout=REQUEST_TIMEOUT,
        json={"model": "m", "max_tokens": 4, "messages": user, "temperature": 1e-320},
    )
    assert anthropic_tiny.status_code == 200, anthropic_tiny.text


def test_unpaired_surrogate_escapes_are_a_400_that_stores_nothing(reef: ReefServer) -> None:
    """JSON may escape a lone UTF-16 surrogate (`\\ud800`), which no UTF-8 text (the store, the
    tokenizer) can hold: it was a 500 on every body-reading route."""
    receipt = httpx.post(
        f"{reef.base_url}/chat/completions",
        headers=AUTH,
        timeout=REQUEST_TIMEOUT,
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ).headers["x-reef-agent-record-id"]
    before = snapshot(reef)
    lone = '"a \\ud800 b"'
    for path, raw in [
        ("/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": %s}]}' % lone),
        (
            "/v1/chat/completions",
            '{"model": "m", "stream": true, "messages": [{"role": "user", "content": %s}]}' % lone,
        ),
        ("/v1/messages", '{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": %s}]}' % lone),
        ("/v1/messages/count_tokens", '{"model": "m", "messages": [{"role": "user", "content": %s}]}' % lone),
        ("/reef/report", '{"references": ["%s"], "score": 1, "feedback": %s}' % (receipt, lone)),
        ("/reef/report", '{"references": ["%s"], "score": 1, "metadata": {%s: 1}}' % (receipt, lone)),
    ]:
        response = httpx.post(
            f"{reef.url}{path}",
            content=raw.encode(),
            timeout=REQUEST_TIMEOUT,
            headers={**AUTH, "content-type": "application/json"},
        )
        assert response.status_code == 400 and "surrogate" in response.text, (path, response.text)
    assert snapshot(reef) == before
    paired = httpx.post(
        f"{reef.base_url}/chat/completions",
        headers={**AUTH, "content-type": "application/json"},
        content=b'{"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}',
    )
    assert paired.status_code == 200  # a proper pair is one character
