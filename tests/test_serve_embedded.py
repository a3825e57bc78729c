"""`reef serve` on the embedded runtime (the tiny test model): both SDKs, streaming and not,
records that carry token ids, log-probs and spans verified against the frozen release."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import anthropic
import openai
import pytest

from reef.client import ReefClient
from tests.helpers.reef_server import ReefServer

USER = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def reef(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings = {"embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": 12, "threads": 1}}
    with ReefServer(tmp_path_factory.mktemp("reef-embedded"), settings) as server:
        yield server


@pytest.fixture
def oai(reef: ReefServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=reef.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def client(reef: ReefServer) -> Iterator[ReefClient]:
    with ReefClient(reef.url) as c:
        yield c


def test_a_plain_answer_is_recorded_with_verified_tokens(oai: openai.OpenAI, client: ReefClient) -> None:
    raw = oai.chat.completions.with_raw_response.create(model="anything", messages=USER, max_tokens=8, temperature=0)
    completion = raw.parse()
    record = client.record(raw.headers["x-reef-agent-record-id"])["record"]
    tokens = record["token_ids"]
    assert tokens and len(tokens) == len(record["logprobs"]) == completion.usage.completion_tokens
    assert all(lp <= 0 for lp in record["logprobs"])
    spans = record["spans"]
    assert spans[0]["start"] == 0 and spans[-1]["end"] == len(tokens)
    assert {s["runtime_load_id"] for s in spans} == {record["release"]["runtime_load_id"]}
    assert record["release"]["release_id"] == raw.headers["x-reef-release-id"]
    client.report(raw.headers["x-reef-agent-record-id"], score=0.0, feedback="not a colour")


def test_a_stream_is_recorded_in_progress_then_complete_and_verified(oai: openai.OpenAI, client: ReefClient) -> None:
    raw = oai.chat.completions.with_raw_response.create(model="m", messages=USER, max_tokens=8, stream=True)
    receipt = raw.headers["x-reef-agent-record-id"]
    assert client.record(receipt)["record"]["status"] in ("in_progress", "complete")  # valid from the first byte
    chunks = list(raw.parse())
    reef_chunk = next(c for c in chunks if not c.choices and getattr(c, "reef", None))
    assert reef_chunk.reef == {
        "agent_record_id": receipt,
        "release_id": raw.headers["x-reef-release-id"],
        "verified": True,
    }
    record = client.record(receipt)["record"]
    assert record["status"] == "complete" and record["token_ids"]


def test_anthropic_stream_carries_the_reef_event(reef: ReefServer, client: ReefClient) -> None:
    ant = anthropic.Anthropic(base_url=reef.url, api_key="unused", max_retries=0, timeout=60)
    with ant.messages.stream(model="m", max_tokens=8, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.usage.output_tokens >= 1 and isinstance(text, str)
    receipt = final.id.removeprefix("msg_")
    assert client.record(receipt)["record"]["status"] == "complete"


def test_concurrent_requests_all_get_their_own_receipts(oai: openai.OpenAI, client: ReefClient) -> None:
    def ask(i: int) -> str:
        raw = oai.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": f"Count to {i}."}], max_tokens=6
        )
        return raw.headers["x-reef-agent-record-id"]

    with ThreadPoolExecutor(4) as pool:
        receipts = list(pool.map(ask, range(4)))
    assert len(set(receipts)) == 4
    for receipt in receipts:
        record = client.record(receipt)["record"]
        assert record["status"] == "complete" and record["request"]["messages"][0]["content"].startswith("Count to")


def test_models_lists_the_embedded_model(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list()] == ["smollm2-135m-instruct"]
