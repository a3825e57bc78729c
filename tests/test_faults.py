"""Fault injection: the upstream provider hangs, resets the connection, answers 500, answers
malformed JSON, stops halfway through, or falls silent halfway through. For the OpenAI and Anthropic SDKs, streaming and
not, the client gets a clear error in its own dialect within the configured upstream timeout,
the record is marked `incomplete` with the reason, and the server keeps serving."""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from reef.client import ReefClient
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "fault-token-91c2"
UPSTREAM_TIMEOUT = 1.0
SLACK = 4.0  # seconds beyond the upstream timeout that a loaded 2-core CI machine may need
USER = [{"role": "user", "content": "tell me something"}]

# fault name -> (scripted upstream arguments, words the recorded reason must contain)
FAULTS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "hang": ({"mode": "hang"}, ("timed out",)),
    "reset": ({"mode": "reset"}, ("connection to upstream", "broke")),
    "status_500": ({"status": 500, "error": "provider exploded"}, ("500", "provider exploded")),
    "malformed": ({"mode": "malformed", "text": "an answer cut into invalid JSON"}, ("malformed JSON",)),
    "stop_midstream": ({"mode": "stop_midstream", "text": "half of an answer that stops here"}, ("upstream",)),
    "stall_midstream": ({"mode": "stall_midstream", "text": "half of an answer, then silence"}, ("timed out",)),
}


@pytest.fixture(scope="module")
def reef(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings = {
        "tokens": [TOKEN],
        "recipes": {"default": "skills"},
        "upstream": {"url": upstream.base_url, "model": "provider-model", "timeout": UPSTREAM_TIMEOUT},
    }
    with ReefServer(tmp_path_factory.mktemp("reef-faults"), settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(reef: ReefServer) -> Iterator[ReefClient]:
    with ReefClient(reef.url, TOKEN) as c:
        yield c


@pytest.fixture(autouse=True)
def fresh_script(upstream: ScriptedUpstream) -> None:
    upstream.clear()


def call_openai(reef: ReefServer, stream: bool, receipt: str) -> None:
    oai = openai.OpenAI(base_url=reef.base_url, api_key=TOKEN, max_retries=0, timeout=30)
    headers = {"x-reef-agent-record-id": receipt}
    if not stream:
        oai.chat.completions.create(model="m", messages=USER, extra_headers=headers)
        return
    for _ in oai.chat.completions.create(model="m", messages=USER, stream=True, extra_headers=headers):
        pass


def call_anthropic(reef: ReefServer, stream: bool, receipt: str) -> None:
    ant = anthropic.Anthropic(base_url=reef.url, api_key=TOKEN, max_retries=0, timeout=30)
    headers = {"x-reef-agent-record-id": receipt}
    if not stream:
        ant.messages.create(model="m", max_tokens=32, messages=USER, extra_headers=headers)
        return
    with ant.messages.stream(model="m", max_tokens=32, messages=USER, extra_headers=headers) as events:
        for _ in events:
            pass


CALLS = {"openai": (call_openai, openai.APIError), "anthropic": (call_anthropic, anthropic.APIError)}


def await_finished(client: ReefClient, receipt: str, deadline_s: float = 10.0) -> dict[str, Any]:
    """A stream's record is finished by the server just after the last byte; poll for it."""
    deadline = time.monotonic() + deadline_s
    while (record := client.record(receipt)["record"])["status"] == "in_progress" and time.monotonic() < deadline:
        time.sleep(0.05)
    return record


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("dialect", sorted(CALLS))
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_failing_upstream_gives_a_clear_error_and_an_incomplete_record(
    reef: ReefServer, client: ReefClient, upstream: ScriptedUpstream, fault: str, dialect: str, stream: bool
) -> None:
    script, reason_words = FAULTS[fault]
    call, sdk_error = CALLS[dialect]
    receipt = f"fault-{fault}-{dialect}-{int(stream)}-{uuid.uuid4().hex[:8]}"
    upstream.script(**script)
    started = time.monotonic()
    with pytest.raises(sdk_error) as failure:
        call(reef, stream, receipt)
    elapsed = time.monotonic() - started
    assert elapsed < UPSTREAM_TIMEOUT + SLACK, f"{fault} took {elapsed:.1f}s to fail"
    if not stream:  # a plain answer fails with a 502 in the client's dialect
        assert isinstance(failure.value, openai.APIStatusError if dialect == "openai" else anthropic.APIStatusError)
        assert failure.value.status_code == 502
        body = failure.value.body
        assert isinstance(body, dict) and "upstream" in str(body)
    assert "upstream" in str(failure.value).lower()
    record = await_finished(client, receipt)
    assert record["status"] == "incomplete"
    assert all(word in record["error"] for word in reason_words), record["error"]
    upstream.script(text="all good again")  # the server keeps serving
    healthy = openai.OpenAI(base_url=reef.base_url, api_key=TOKEN, max_retries=0, timeout=30)
    assert healthy.chat.completions.create(model="m", messages=USER).choices[0].message.content == "all good again"


def test_raw_error_bodies_are_each_dialects_shape(reef: ReefServer, upstream: ScriptedUpstream) -> None:
    headers = {"authorization": f"Bearer {TOKEN}"}
    upstream.script(status=500, error="boom")
    openai_shape = httpx.post(
        f"{reef.base_url}/chat/completions", json={"model": "m", "messages": USER}, headers=headers, timeout=30
    )
    assert openai_shape.status_code == 502
    assert set(openai_shape.json()["error"]) >= {"message", "type", "code"}
    upstream.script(mode="reset")
    anthropic_shape = httpx.post(
        f"{reef.base_url}/messages", json={"model": "m", "max_tokens": 8, "messages": USER}, headers=headers, timeout=30
    )
    assert anthropic_shape.status_code == 502
    assert anthropic_shape.json()["type"] == "error" and anthropic_shape.json()["error"]["type"] == "api_error"


def test_a_stream_that_fails_ends_with_the_dialects_error_event(reef: ReefServer, upstream: ScriptedUpstream) -> None:
    headers = {"authorization": f"Bearer {TOKEN}"}
    upstream.script(mode="stop_midstream", text="one two three four five")
    cut = httpx.post(
        f"{reef.base_url}/chat/completions",
        json={"model": "m", "messages": USER, "stream": True},
        headers=headers,
        timeout=30,
    )
    frames = cut.text.strip().split("\n\n")
    assert cut.status_code == 200 and frames[-1] == "data: [DONE]" and '"error"' in frames[-2]
    upstream.script(mode="hang")
    hung = httpx.post(
        f"{reef.base_url}/messages",
        json={"model": "m", "max_tokens": 8, "messages": USER, "stream": True},
        headers=headers,
        timeout=30,
    )
    if hung.headers["content-type"].startswith("text/event-stream"):
        assert hung.text.strip().split("\n\n")[-1].startswith("event: error")
    else:  # failed before the first byte: a plain error in the dialect's shape
        assert hung.status_code == 502 and hung.json()["type"] == "error"


def test_the_server_stays_healthy_after_every_fault(reef: ReefServer, client: ReefClient) -> None:
    status = client.status()
    assert status["serving"]["in_flight"] == 0
    assert httpx.get(f"{reef.url}/healthz").status_code == 200


@pytest.mark.parametrize("dialect", sorted(CALLS))
def test_an_upstream_4xx_is_relayed_with_a_receipt_that_can_be_reported(
    reef: ReefServer, client: ReefClient, upstream: ScriptedUpstream, dialect: str
) -> None:
    """A provider's refusal (a context overflow, say) is part of the agent's experience: the
    client gets the provider's status and message, and a receipt to report on."""
    receipt = f"refused-{dialect}-{uuid.uuid4().hex[:8]}"
    upstream.script(status=400, error="prompt refused by the provider")
    call, _ = CALLS[dialect]
    with pytest.raises(
        openai.BadRequestError if dialect == "openai" else anthropic.BadRequestError,
        match="prompt refused by the provider",
    ) as refused:
        call(reef, False, receipt)
    assert refused.value.response.headers["x-reef-agent-record-id"] == receipt
    record = client.record(receipt)["record"]
    assert record["status"] == "incomplete" and "prompt refused by the provider" in record["error"]
    assert client.report(receipt, score=0.0, feedback="the context overflowed")["references"] == [receipt]
