"""EmbeddedRuntime's shared-prefix prefill: a batch whose prompts share a long start prefills it
once and copies its KV rows. The tokens sampled and the log-probs recorded must stay those of the
plain path (the trainer recomputes them: importance ratios must stay ~1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.core.chat import ChatRequest, ChatResult, Message
from reef.runtimes.embedded import EmbeddedRuntime
from tests.helpers.lora import lora_files
from tests.test_embedded_runtime import LORA_WARNING, ask, gather_batched, with_runtime

SYSTEM = (
    "You are a careful assistant for a team of engineers. Answer briefly, name your assumptions, "
    "prefer plain words over jargon, and say so when you do not know. Here is a worked example: "
    "Q: what is 12 times 11? A: 132, because 12 times 10 is 120 and 12 more is 132."
)
QUESTIONS = [
    "Why?",
    "What is the capital of France?",
    "Count from one to five, please, slowly and clearly.",
    "Name a fish.",
]


def chat(*turns: str, **kw: object) -> ChatRequest:
    """A request with the long system prompt, then alternating user/assistant turns."""
    kw.setdefault("max_tokens", 8)
    messages = (Message("system", SYSTEM),) + tuple(
        Message("user" if i % 2 == 0 else "assistant", text) for i, text in enumerate(turns)
    )
    return ChatRequest(model="client-model", messages=messages, dialect="openai", **kw)  # type: ignore[arg-type]


async def both_ways(rt: EmbeddedRuntime, jobs: list[tuple[ChatRequest, str]]) -> tuple[list[ChatResult], ...]:
    """The same requests batched without the shared prefix, then with it (one batch per load each)."""
    rt.min_shared_prefix = 0
    saved = rt.shared_prefix_tokens
    plain = await gather_batched(rt, jobs)
    assert rt.shared_prefix_tokens == saved
    rt.min_shared_prefix = 16
    shared = await gather_batched(rt, jobs)
    assert rt.shared_prefix_tokens > saved  # the feature did run
    return plain, shared


def assert_same(plain: list[ChatResult], shared: list[ChatResult]) -> None:
    for one, other in zip(plain, shared, strict=True):
        assert other.token_ids == one.token_ids
        assert other.logprobs == pytest.approx(one.logprobs, abs=1e-4)
        assert other.text == one.text


@pytest.mark.filterwarnings(LORA_WARNING)
def test_greedy_tokens_and_logprobs_match_the_plain_prefill_on_base_and_lora(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    adapter = lora_files(tiny_model_dir, tmp_path / "a", 1)
    # suffixes of different lengths, and rows leaving the batch at different steps
    requests = [chat(q, temperature=0, max_tokens=n) for q, n in zip(QUESTIONS, (5, 9, 7, 12))]

    async def body(rt: EmbeddedRuntime) -> None:
        base, lora = await rt.load("base", {}), await rt.load("lora", adapter)
        prompts = [rt.prompt_ids(r) for r in requests]
        assert len({len(p) for p in prompts}) == len(prompts)
        for load in (base, lora):
            batches = rt.batches_run
            plain, shared = await both_ways(rt, [(r, load) for r in requests])
            assert rt.batches_run - batches == 2
            assert_same(plain, shared)
            assert any(len(r.token_ids) > 1 for r in shared)  # decoding went on past the prefill

    with_runtime(tiny_model_dir, body)


def test_seeded_sampling_draws_the_same_tokens(tiny_model_dir: Path) -> None:
    requests = [chat(q, temperature=1.0, seed=40 + i, max_tokens=10) for i, q in enumerate(QUESTIONS)]

    async def body(rt: EmbeddedRuntime) -> None:
        load = await rt.load("base", {})
        assert_same(*await both_ways(rt, [(r, load) for r in requests]))

    with_runtime(tiny_model_dir, body)


def test_a_prompt_that_is_the_whole_common_prefix(tiny_model_dir: Path) -> None:
    # a conversation and its continuations: the first prompt is the start of every other one
    requests = [
        chat("Why?", temperature=0),
        chat("Why?", "Because.", "Are you sure?", temperature=0),
        chat("Why?", "Because it is so.", "Name a fish.", temperature=0),
    ]

    async def body(rt: EmbeddedRuntime) -> None:
        prompts = [rt.prompt_ids(r) for r in requests]
        assert all(p[: len(prompts[0])] == prompts[0] for p in prompts)
        load = await rt.load("base", {})
        saved = rt.shared_prefix_tokens
        plain, shared = await both_ways(rt, [(r, load) for r in requests])
        assert rt.shared_prefix_tokens - saved == (len(prompts[0]) - 1) * 2  # one token short: each row keeps one
        assert_same(plain, shared)

    with_runtime(tiny_model_dir, body)


def test_short_or_missing_common_prefix_takes_the_plain_path(tiny_model_dir: Path) -> None:
    async def body(rt: EmbeddedRuntime) -> None:
        load = await rt.load("base", {})
        short = [ask(q, temperature=0, max_tokens=3) for q in QUESTIONS]  # share little beyond the template
        prompts = [rt.prompt_ids(r) for r in short]
        common = next(i for i in range(len(prompts[0])) if len({p[i] for p in prompts}) > 1)
        rt.min_shared_prefix = common + 1  # the threshold just past what they share
        await gather_batched(rt, [(r, load) for r in short])
        assert rt.shared_prefix_tokens == 0
        rt.min_shared_prefix = 16
        await gather_batched(rt, [(chat("Why?", temperature=0, max_tokens=3), load)])  # a batch of one
        mixed = [chat("Why?", temperature=0, max_tokens=3), ask("Why?", temperature=0, max_tokens=3)]
        await gather_batched(rt, [(r, load) for r in mixed])
        assert rt.shared_prefix_tokens == 0

    with_runtime(tiny_model_dir, body)


def test_the_shared_prefix_length_leaves_each_row_a_token_and_skips_short_ones() -> None:
    from reef.core.prefix import shared_prefix_length

    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5]], 2) == 3
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3, 4]], 2) == 2  # the shorter prompt keeps its last token
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5]], 4) == 0  # under the minimum: not worth it
    assert shared_prefix_length([[1, 2, 3, 4]], 1) == 0 and shared_prefix_length([[1, 2], [1, 2]], 0) == 0
    assert shared_prefix_length([[], [1]], 1) == 0
