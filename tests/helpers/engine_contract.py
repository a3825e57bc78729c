"""The engine contract: what `reef serve` promises on an inference engine it serves through
(SGLang, vLLM), checked against a live Reef attached to that engine. The very same checks run in
tests/test_sglang_runtime.py (against the SGLang double, tests/helpers/sglang_double.py) and in
bench/engine_contract.py (against a real SGLang and a real GPU vLLM), so the double and the
engines answer one contract.

The promises: both SDKs (OpenAI, Anthropic), plain and streaming, are answered and recorded with
the engine's own token ids and log-probs, verified against the release the request was frozen to
(clients never see the log-probs); a LoRA release is served by the next request, rolled back, and
unloaded from the engine once nothing pins it; a corrupt adapter is refused while the previous
release keeps serving; an engine that dies is answered with 503 in the client's dialect until it
is back, with the serving adapter loaded again under the same name.

Each check takes a `Contract` and returns what it measured (the benchmark's JSON); a broken
promise is an AssertionError that says which. `make_releases` prepares the state directory the
checks expect.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import anthropic
import httpx
import openai

from reef.client import ReefClient, ReefClientError

SCENARIO = "tuned"
USER = [{"role": "user", "content": "Name a colour."}]
HEADERS = {"x-reef-scenario": SCENARIO}


def make_releases(model_dir: Path, state_dir: Path, work: Path) -> dict[str, str]:
    """Scenario `tuned` in `state_dir`, holding the base (no weights), a LoRA adapter with random
    B matrices (it changes the greedy answer), a corrupt adapter, and a rollback to the base at
    its head, so serving starts on the base. Returns the release ids by role."""
    from reef.commit.release_chain import Candidate
    from reef.commit.state import ReefState
    from reef.core.types import ArtifactKind, Verdict
    from tests.helpers.lora import lora_files

    good = lora_files(model_dir, work / "lora")
    corrupt = {**good, "adapter_model.safetensors": b"\x00" * 64 + b"not a safetensors file"}
    state = ReefState.open(state_dir)
    try:
        chain = state.create(SCENARIO, "sao")
        base = chain.head()
        select = Verdict("select", {"wins": 3})
        adapter = chain.publish(Candidate(good, ArtifactKind.WEIGHTS), base.release_id, verdict=select)
        broken = chain.publish(Candidate(corrupt, ArtifactKind.WEIGHTS), adapter.release_id, verdict=select)
        chain.rollback(base.release_id, broken.release_id)
    finally:
        state.close()
    return {"base": base.release_id, "adapter": adapter.release_id, "broken": broken.release_id}


@dataclass
class Contract:
    """A Reef attached to an engine, and how to crash and restart that engine."""

    reef_url: str
    engine: str  # "sglang" or "vllm": the runtime Reef's status must name
    engine_url: str
    releases: dict[str, str]
    kill_engine: Callable[[], None]
    restart_engine: Callable[[], None] | None  # None: Reef restarts it itself (a vLLM it supervises)
    timeout: float = 120.0
    back_within: float = 300.0  # seconds an engine may take to serve again after a kill

    @cached_property
    def oai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.reef_url}/v1", api_key="unused", max_retries=0, timeout=self.timeout)

    @cached_property
    def ant(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.reef_url, api_key="unused", max_retries=0, timeout=self.timeout)

    @cached_property
    def reef(self) -> ReefClient:
        return ReefClient(self.reef_url, timeout=self.timeout)

    @cached_property
    def model(self) -> str:
        return self.oai.models.list().data[0].id

    def record(self, receipt: str) -> dict[str, Any]:
        """The stored record, with `verified` (invariant 2) put into it."""
        answer = self.reef.record(receipt)
        return {**answer["record"], "verified": answer["verified"]}

    def greedy(self) -> tuple[str, str]:
        """(text, receipt) of a greedy 8-token answer in the scenario."""
        raw = self.oai.chat.completions.with_raw_response.create(
            model=self.model, messages=USER, max_tokens=8, temperature=0, extra_headers=HEADERS
        )
        return raw.parse().choices[0].message.content or "", raw.headers["x-reef-agent-record-id"]

    def serve(self, role: str) -> str:
        """Point the scenario at a release (by role); its runtime_load_id."""
        return str(self.reef.rollback(SCENARIO, self.releases[role])["serving"]["runtime_load_id"])

    def adapters(self) -> list[str]:
        return list(self.reef.status()["serving"]["adapters"])

    def engine_holds(self, name: str) -> bool:
        """Whether the engine itself holds an adapter of that name (asked of the engine, not Reef)."""
        if self.engine == "vllm":
            models = httpx.get(f"{self.engine_url}/v1/models", timeout=30).json()["data"]
            return any(m["id"] == name for m in models)
        answer = httpx.post(
            f"{self.engine_url}/generate",
            timeout=60,
            json={"input_ids": [1], "sampling_params": {"max_new_tokens": 1, "temperature": 0}, "lora_path": name},
        )
        if answer.status_code == 200:
            return True
        assert "not loaded" in answer.text, answer.text
        return False


def assert_engine_record(record: dict[str, Any], completion_tokens: int) -> None:
    """A complete record carrying the engine's token ids and log-probs, one span of them all
    stamped with the release's runtime load, verified."""
    tokens = record["token_ids"]
    assert record["status"] == "complete", record["status"]
    assert record["verified"] is True, "the record's token spans do not prove where its tokens came from"
    assert tokens and len(tokens) == len(record["logprobs"]) == completion_tokens, (
        len(tokens),
        len(record["logprobs"]),
        completion_tokens,
    )
    assert all(lp <= 0 for lp in record["logprobs"]), record["logprobs"]
    load = record["release"]["runtime_load_id"]
    assert [(s["start"], s["end"], s["runtime_load_id"]) for s in record["spans"]] == [(0, len(tokens), load)]
    assert record["response"]["prompt_token_ids"], "no prompt token ids recorded"


def plain_answers(c: Contract) -> dict[str, Any]:
    """Both SDKs, not streaming: answered, recorded with the engine's tokens, verified; greedy
    answers repeat; the log-probs never reach the client; count_tokens counts the prompt."""
    started = time.monotonic()
    raw = c.oai.chat.completions.with_raw_response.create(model=c.model, messages=USER, max_tokens=8, temperature=0)
    first = time.monotonic() - started
    completion = raw.parse()
    assert completion.choices[0].logprobs is None, "log-probs reached the client"
    record = c.record(raw.headers["x-reef-agent-record-id"])
    assert_engine_record(record, completion.usage.completion_tokens)
    again = c.oai.chat.completions.create(model=c.model, messages=USER, max_tokens=8, temperature=0)
    assert again.choices[0].message.content == completion.choices[0].message.content, "greedy answers differ"

    message = c.ant.messages.create(model=c.model, max_tokens=6, messages=USER)
    stored = c.record(message.id.removeprefix("msg_"))
    assert_engine_record(stored, message.usage.output_tokens)
    prompt = len(stored["response"]["prompt_token_ids"])
    assert message.usage.input_tokens == prompt, (message.usage.input_tokens, prompt)
    assert c.ant.messages.count_tokens(model=c.model, messages=USER).input_tokens == prompt
    return {
        "first_request_s": round(first, 3),
        "openai_tokens": len(record["token_ids"]),
        "anthropic_tokens": len(stored["token_ids"]),
    }


def streamed_answers(c: Contract) -> dict[str, Any]:
    """Both SDKs, streaming: the stream ends with Reef's verified receipt, the record is
    complete with the engine's tokens, and no chunk carries log-probs."""
    raw = c.oai.chat.completions.with_raw_response.create(
        model=c.model, messages=USER, max_tokens=6, stream=True, seed=7, stream_options={"include_usage": True}
    )
    chunks = list(raw.parse())
    reef_chunk = next(ch for ch in chunks if not ch.choices and getattr(ch, "reef", None))
    assert reef_chunk.reef["verified"] is True
    assert all(ch.choices[0].logprobs is None for ch in chunks if ch.choices), "log-probs reached the client"
    usage = next(ch.usage for ch in chunks if ch.usage)
    record = c.record(raw.headers["x-reef-agent-record-id"])
    assert_engine_record(record, usage.completion_tokens)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == record["response"]["text"], "the streamed text is not the recorded one"

    with c.ant.messages.stream(model=c.model, max_tokens=5, messages=USER) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    stored = c.record(final.id.removeprefix("msg_"))
    assert_engine_record(stored, final.usage.output_tokens)
    return {
        "openai_tokens": len(record["token_ids"]),
        "anthropic_tokens": len(stored["token_ids"]),
        "anthropic_text_chars": len(streamed),
    }


def status_names_the_engine(c: Contract) -> dict[str, Any]:
    """/v1/models lists the engine's model; /reef/status names the runtime, says it verifies
    tokens, and lists no adapter while the base serves."""
    c.serve("base")
    models = [m.id for m in c.oai.models.list().data]
    assert models == [c.model], models
    status = c.reef.status()
    assert status["serving"]["runtime"] == c.engine, status["serving"]
    assert status["provenance"]["runtime_verifies_tokens"] is True
    assert _until(lambda: c.adapters() == [], 10), c.adapters()
    return {"model": c.model}


def adapter_lifecycle(c: Contract) -> dict[str, Any]:
    """A LoRA release is served by the next request (the greedy answer changes, the record is
    stamped with its load), a corrupt one is refused while it keeps serving, and rolling back
    to the base serves the base again and unloads the adapter from the engine."""
    c.serve("base")
    base_text, _ = c.greedy()
    started = time.monotonic()
    load = c.serve("adapter")
    load_s = time.monotonic() - started
    assert c.adapters() == [load] and c.engine_holds(load)
    tuned_text, receipt = c.greedy()
    assert tuned_text != base_text, "the adapter did not change the greedy answer"
    stored = c.record(receipt)
    assert stored["verified"] is True and {s["runtime_load_id"] for s in stored["spans"]} == {load}

    try:
        c.reef.rollback(SCENARIO, c.releases["broken"])
    except ReefClientError as exc:
        refusal = exc.message
    else:
        raise AssertionError("a corrupt adapter was accepted")
    assert c.greedy()[0] == tuned_text, "the previous release stopped serving after a refused load"
    assert c.adapters() == [load]

    c.serve("base")
    assert c.greedy()[0] == base_text
    assert _until(lambda: c.adapters() == [], 10), "the adapter stayed loaded once nothing pinned it"
    assert not c.engine_holds(load), "the engine still holds the unloaded adapter"
    return {"adapter_load_s": round(load_s, 3), "corrupt_refusal": refusal[:200]}


def engine_restart(c: Contract) -> dict[str, Any]:
    """An engine killed with SIGKILL: Reef answers 503 with Retry-After in both dialects
    (streams too) while it is down, and once it is back the adapter release serves again, the
    adapter loaded under its same name."""
    load = c.serve("adapter")
    tuned_text, _ = c.greedy()
    c.kill_engine()
    killed = time.monotonic()
    body = {"model": c.model, "messages": USER, "max_tokens": 8, "temperature": 0}
    down = httpx.post(f"{c.reef_url}/v1/chat/completions", json=body, headers=HEADERS, timeout=c.timeout)
    assert down.status_code == 503 and down.headers.get("retry-after"), (down.status_code, down.text)
    assert down.json()["error"]["message"]
    stream = httpx.post(
        f"{c.reef_url}/v1/chat/completions", json={**body, "stream": True}, headers=HEADERS, timeout=c.timeout
    )
    assert stream.status_code == 503, (stream.status_code, stream.text)
    ant = httpx.post(
        f"{c.reef_url}/v1/messages",
        json={"model": c.model, "max_tokens": 4, "messages": USER},
        headers=HEADERS,
        timeout=c.timeout,
    )
    assert ant.status_code == 503 and ant.json()["type"] == "error", (ant.status_code, ant.text)
    assert ant.json()["error"]["type"] == "overloaded_error" and ant.headers.get("retry-after")
    if c.restart_engine is not None:
        c.restart_engine()
    refusals = 3
    while True:
        answer = httpx.post(f"{c.reef_url}/v1/chat/completions", json=body, headers=HEADERS, timeout=c.timeout)
        if answer.status_code == 200:
            break
        assert answer.status_code == 503, (answer.status_code, answer.text)
        refusals += 1
        assert time.monotonic() - killed < c.back_within, f"not serving {c.back_within:.0f}s after the kill"
        time.sleep(0.5)
    back = time.monotonic() - killed
    assert answer.json()["choices"][0]["message"]["content"] == tuned_text, "another answer after the restart"
    assert c.adapters() == [load] and c.engine_holds(load), "the adapter is not back under its name"
    return {"back_after_kill_s": round(back, 1), "refused_with_503": refusals}


CHECKS: list[tuple[str, Callable[[Contract], dict[str, Any]]]] = [
    ("plain_answers", plain_answers),
    ("streamed_answers", streamed_answers),
    ("status_names_the_engine", status_names_the_engine),
    ("adapter_lifecycle", adapter_lifecycle),
    ("engine_restart", engine_restart),
]


def _until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
