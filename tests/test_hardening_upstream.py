"""Hardening of the upstream runtime (issue 12, findings 7-9), through a real `reef serve` in
front of a scripted provider, with the official SDKs:

- a provider's answer is bounded by `upstream.max_response_bytes` (a whole body, a stream in
  all, one SSE line that never ends): past it, a 502 naming the setting, an `incomplete`
  record, and Reef stops reading there instead of buffering the rest;
- a provider's redirect is never followed (the prompt goes nowhere else): a 3xx is a 502 naming
  the status and the Location, for chat calls and count_tokens alike;
- a provider's `Retry-After` (and `retry-after-ms`) reaches the client with the relayed error.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Iterator

import anthropic
import openai
import pytest

from reef.client import ReefClient
from reef.config import load_config
from reef.core.chat import ChatRequest, Message
from reef.core.errors import RuntimeFailure
from reef.core.types import ReleaseRef
from reef.runtimes.factory import build_runtime
from reef.runtimes.upstream import UpstreamRuntime
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "hardening-token-5be1"
LIMIT = 16 * 1024 * 1024  # the documented default of upstream.max_response_bytes
SETTING = "upstream.max_response_bytes"
USER = [{"role": "user", "content": "tell me something"}]
DIALECTS = ["openai", "anthropic"]


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[ScriptedUpstream]:
    """Where a redirect points: it must never hear from Reef."""
    with ScriptedUpstream() as other:
        yield other


@pytest.fixture(scope="module")
def reef(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings = {
        "tokens": [TOKEN],
        "recipes": {"default": "skills"},
        "upstream": {"url": upstream.base_url, "model": "provider-model", "timeout": 10},
    }
    with ReefServer(tmp_path_factory.mktemp("reef-hardening"), settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(reef: ReefServer) -> Iterator[ReefClient]:
    with ReefClient(reef.url, TOKEN) as c:
        yield c


@pytest.fixture(autouse=True)
def fresh_script(upstream: ScriptedUpstream, elsewhere: ScriptedUpstream) -> None:
    upstream.clear()
    elsewhere.clear()


def call(reef: ReefServer, dialect: str, stream: bool, receipt: str) -> str:
    """The answer's text; raises the SDK's error."""
    headers = {"x-reef-agent-record-id": receipt}
    if dialect == "openai":
        oai = openai.OpenAI(base_url=reef.base_url, api_key=TOKEN, max_retries=0, timeout=60)
        if not stream:
            return (
                oai.chat.completions.create(model="m", messages=USER, extra_headers=headers).choices[0].message.content
                or ""
            )
        chunks = oai.chat.completions.create(model="m", messages=USER, stream=True, extra_headers=headers)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ant = anthropic.Anthropic(base_url=reef.url, api_key=TOKEN, max_retries=0, timeout=60)
    if not stream:
        answer = ant.messages.create(model="m", max_tokens=32, messages=USER, extra_headers=headers)
        return "".join(getattr(block, "text", "") for block in answer.content)
    with ant.messages.stream(model="m", max_tokens=32, messages=USER, extra_headers=headers) as events:
        return "".join(events.text_stream)


def sdk_failure(reef: ReefServer, dialect: str, stream: bool, receipt: str) -> Exception:
    with pytest.raises((openai.APIError, anthropic.APIError)) as failure:
        call(reef, dialect, stream, receipt)
    return failure.value


def finished_record(client: ReefClient, receipt: str, deadline_s: float = 10.0) -> dict[str, Any]:
    """A stream's record is finished just after its last byte; poll for it."""
    deadline = time.monotonic() + deadline_s
    while (record := client.record(receipt)["record"])["status"] == "in_progress" and time.monotonic() < deadline:
        time.sleep(0.05)
    return record


def receipt_for(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def still_serving(reef: ReefServer, upstream: ScriptedUpstream) -> None:
    upstream.script(text="all good again")
    assert call(reef, "openai", False, receipt_for("after")) == "all good again"


# -- finding 7: a provider's answer is bounded ---------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_answer_over_the_limit_is_a_502_and_an_incomplete_record(
    reef: ReefServer, client: ReefClient, upstream: ScriptedUpstream, dialect: str, stream: bool
) -> None:
    receipt = receipt_for(f"huge-{dialect}-{int(stream)}")
    upstream.script(mode="huge", size=3 * LIMIT)
    failure = sdk_failure(reef, dialect, stream, receipt)
    if not stream:
        assert isinstance(failure, (openai.APIStatusError, anthropic.APIStatusError)) and failure.status_code == 502
    assert SETTING in str(failure) and str(LIMIT) in str(failure), str(failure)[:300]
    assert upstream.app.huge_sent < 2 * LIMIT, "Reef read on past its limit"
    record = finished_record(client, receipt)
    assert record["status"] == "incomplete" and SETTING in record["error"]
    assert len((record["response"] or {}).get("text", "")) <= LIMIT  # what is stored is bounded too
    still_serving(reef, upstream)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_sse_line_that_never_ends_is_refused_at_the_limit(
    reef: ReefServer, client: ReefClient, upstream: ScriptedUpstream, dialect: str
) -> None:
    receipt = receipt_for(f"sse-line-{dialect}")
    upstream.script(mode="huge_sse_line", size=3 * LIMIT)
    failure = sdk_failure(reef, dialect, True, receipt)
    assert isinstance(failure, (openai.APIStatusError, anthropic.APIStatusError)) and failure.status_code == 502
    assert SETTING in str(failure), str(failure)[:300]
    assert upstream.app.huge_sent < 2 * LIMIT, "Reef buffered the line on past its limit"
    record = finished_record(client, receipt)
    assert record["status"] == "incomplete" and SETTING in record["error"]
    still_serving(reef, upstream)


def ask(*, stream: bool = False) -> ChatRequest:
    return ChatRequest(model="m", messages=(Message("user", "hello"),), dialect="openai", stream=stream)


async def _text(runtime: Any, request: ChatRequest) -> str:
    await runtime.start()
    try:
        parts = [getattr(delta, "text", "") async for delta in runtime.generate(request, ReleaseRef("r", "c", None))]
        return "".join(parts)
    finally:
        await runtime.close()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_the_limit_is_the_upstream_setting(upstream: ScriptedUpstream, stream: bool) -> None:
    """`upstream.max_response_bytes` reaches the runtime (the factory passes it on); a plain
    answer that announces a larger content-length is refused before its body is read."""
    config = load_config(env={}, upstream__url=upstream.base_url, upstream__max_response_bytes=4096)
    upstream.script(text="small answer")
    assert asyncio.run(_text(build_runtime(config), ask(stream=stream))) == "small answer"
    upstream.script(text="word " * 2000)  # 10 kB of text
    with pytest.raises(RuntimeFailure, match=f"{SETTING} \\(4096 bytes\\)") as failure:
        asyncio.run(_text(build_runtime(config), ask(stream=stream)))
    assert failure.value.status == 502


def test_the_sse_parser_holds_at_most_one_event_of_the_limit() -> None:
    from reef.runtimes.upstream_wire import SSEParser, UpstreamProblem

    line = SSEParser(max_event_bytes=1000)
    assert line.feed(b"data: ") == []
    for _ in range(4):
        assert line.feed(b"x" * 200) == []  # 806 bytes held so far
    with pytest.raises(UpstreamProblem, match=f"{SETTING} \\(1000 bytes\\)"):
        line.feed(b"x" * 200)  # a line still arriving is refused once it passes the limit
    lines = SSEParser(max_event_bytes=1000)
    assert lines.feed(b"data: " + b"y" * 600 + b"\n\n") == [(None, "y" * 600)]  # the count starts again per event
    with pytest.raises(UpstreamProblem, match=SETTING):
        lines.feed(b"data: " + b"y" * 600 + b"\ndata: " + b"y" * 600 + b"\n")  # many lines of one event count together
    split = SSEParser(max_event_bytes=1000)
    pieces = [b"event: a\nda", b'ta: {"t": ', b'"x"}', b"\n", b"\n"]
    assert [event for piece in pieces for event in split.feed(piece)] == [("a", '{"t": "x"}')]


# -- finding 8: redirects are not followed -----------------------------------------------------------


@pytest.mark.parametrize("status,stream", [(307, False), (307, True), (301, False), (308, True), (302, False)])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_provider_redirect_is_a_502_and_the_prompt_goes_nowhere_else(
    reef: ReefServer,
    client: ReefClient,
    upstream: ScriptedUpstream,
    elsewhere: ScriptedUpstream,
    dialect: str,
    status: int,
    stream: bool,
) -> None:
    receipt = receipt_for(f"redirect-{status}-{dialect}-{int(stream)}")
    location = f"{elsewhere.base_url}/chat/completions"
    upstream.script(mode="redirect", status=status, location=location)
    failure = sdk_failure(reef, dialect, stream, receipt)
    assert isinstance(failure, (openai.APIStatusError, anthropic.APIStatusError)) and failure.status_code == 502
    assert f"answered {status}" in str(failure) and location in str(failure), str(failure)[:300]
    assert elsewhere.app.hits == []
    record = finished_record(client, receipt)
    assert record["status"] == "incomplete" and location in record["error"]


def test_count_tokens_does_not_follow_a_redirect(upstream: ScriptedUpstream, elsewhere: ScriptedUpstream) -> None:
    runtime = UpstreamRuntime(upstream.root_url, dialect="anthropic", model="m")
    upstream.script(mode="redirect", status=307, location=f"{elsewhere.root_url}/v1/messages/count_tokens")

    async def count() -> int:
        try:
            return await runtime.count_tokens(ask())
        finally:
            await runtime.close()

    with pytest.raises(RuntimeFailure, match="answered 307") as failure:
        asyncio.run(count())
    assert failure.value.status == 502 and elsewhere.app.hits == []


# -- finding 9: Retry-After reaches the client ---------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_429_is_relayed_with_its_retry_after(
    reef: ReefServer, upstream: ScriptedUpstream, dialect: str, stream: bool
) -> None:
    upstream.script(status=429, error="slow down", headers={"retry-after": "7", "retry-after-ms": "7000"})
    failure = sdk_failure(reef, dialect, stream, receipt_for(f"429-{dialect}-{int(stream)}"))
    assert isinstance(failure, (openai.RateLimitError, anthropic.RateLimitError)) and "slow down" in str(failure)
    assert failure.response.headers.get("retry-after") == "7"
    assert failure.response.headers.get("retry-after-ms") == "7000"


def test_a_provider_503_keeps_its_retry_after_on_the_502(reef: ReefServer, upstream: ScriptedUpstream) -> None:
    upstream.script(status=503, error="overloaded", headers={"retry-after": "30", "x-unrelated": "kept upstream"})
    failure = sdk_failure(reef, "openai", False, receipt_for("503"))
    assert isinstance(failure, openai.APIStatusError) and failure.status_code == 502
    assert failure.response.headers.get("retry-after") == "30"
    assert "x-unrelated" not in failure.response.headers
