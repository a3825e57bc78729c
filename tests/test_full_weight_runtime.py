"""The embedded runtime serves full-weight releases: each is a model of its own beside the base,
answering with its own weights (the greedy ids transformers gives for the same folder); requests
in flight while one is read finish on the weights they started with; a batch of several loads
answers as each alone; an unloaded one refuses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reef.core.errors import RuntimeFailure
from reef.core.training import full_weights_part, weights_kind
from reef.runtimes.embedded import EmbeddedRuntime
from tests.helpers.full_weights import full_weight_files
from tests.test_embedded_runtime import PROMPTS, ask, collect, gather_batched, with_runtime


def test_a_full_weight_release_answers_with_its_own_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    files = full_weight_files(tiny_model_dir, seed=1, optimiser_bytes=4096)
    assert weights_kind(files) == "full" and weights_kind({}) is None
    assert not any(name.startswith("training/") for name in full_weights_part(files) or {})
    request = ask(PROMPTS[1], temperature=0, max_tokens=16)

    async def body(rt: EmbeddedRuntime) -> tuple[list[int], list[int]]:
        base = await rt.load("base", {})
        base_ids = (await collect(rt, request, base))[0].token_ids
        full = await rt.load("full", files)
        full_ids = (await collect(rt, request, full))[0].token_ids
        assert rt.resident() == {"base": 1, "adapter": 0, "full": 1}
        batched = await gather_batched(rt, [(request, full), (request, base), (request, full)])
        assert [r.token_ids for r in batched] == [full_ids, base_ids, full_ids]
        await rt.unload(full)
        with pytest.raises(RuntimeFailure):
            await collect(rt, request, full)
        assert (await collect(rt, request, base))[0].token_ids == base_ids
        return base_ids, full_ids

    base_ids, full_ids = with_runtime(tiny_model_dir, body)
    assert full_ids != base_ids
    folder = tmp_path / "full"  # transformers alone, on the same folder, answers the same
    folder.mkdir()
    for name, data in (full_weights_part(files) or {}).items():
        (folder / name).write_bytes(data)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    from transformers import AutoTokenizer

    from reef.runtimes.chatml import prompt_ids

    prompt = prompt_ids(AutoTokenizer.from_pretrained(str(tiny_model_dir)), request)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=len(full_ids), do_sample=False)
    assert out[0, len(prompt) :].tolist()[: len(full_ids)] == full_ids


def test_requests_in_flight_while_full_weights_load_finish_on_the_base(tiny_model_dir: Path) -> None:
    files = full_weight_files(tiny_model_dir, seed=2)
    request = ask(PROMPTS[3], temperature=0, max_tokens=40)

    async def body(rt: EmbeddedRuntime) -> None:
        base = await rt.load("base", {})
        alone = (await collect(rt, request, base))[0].token_ids
        answers = [asyncio.create_task(collect(rt, request, base)) for _ in range(6)]
        full = await rt.load("full", files)  # read while the six decode
        results = await asyncio.gather(*answers)  # none fails
        assert all(result.token_ids == alone for result, _ in results)
        assert all(set(result.token_loads) == {base} for result, _ in results)
        served = (await collect(rt, request, full))[0]
        assert served.token_ids != alone and set(served.token_loads) == {full}

    with_runtime(tiny_model_dir, body)


def test_broken_full_weights_are_refused_and_the_base_keeps_serving(tiny_model_dir: Path) -> None:
    files = full_weight_files(tiny_model_dir, seed=3)
    shard = next(name for name in files if name.endswith(".safetensors"))

    async def body(rt: EmbeddedRuntime) -> None:
        base = await rt.load("base", {})
        with pytest.raises(RuntimeFailure, match="full weights"):
            await rt.load("broken", {**files, shard: b"not safetensors"})
        assert (await collect(rt, ask(), base))[0].token_ids

    with_runtime(tiny_model_dir, body)
