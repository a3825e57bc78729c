"""Full-weight releases pushed into an engine, against the SGLang double (SGLang's own
`/update_weights_from_disk`, `/pause_generation`, `/continue_generation` over the tiny model):
requests in flight during a push finish on the weights they started with; after it the engine
answers with the release's weights; a request frozen to the older release is stamped with the
load that served it (every token's load is known); a broken release is refused and the engine
keeps the weights it had; an engine killed and started again (on the base) is given the release
again before it serves; a release without weights pushes the base back (a rollback to the base
serves the base's greedy ids again)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from reef.core.chat import ChatRequest, ChatResult, Message
from reef.core.errors import RuntimeFailure
from reef.core.types import ReleaseRef
from reef.runtimes.sglang import SGLangRuntime
from tests.helpers.engine_process import EngineProcess
from tests.helpers.full_weights import full_weight_files
from tests.helpers.reef_server import ROOT, free_port

LONG = ChatRequest(
    model="m", messages=(Message("user", "Tell me a long story about the sea"),), dialect="openai", temperature=0
)


async def answer(runtime: SGLangRuntime, load_id: str, max_tokens: int = 8) -> ChatResult:
    result = ChatResult()
    request = ChatRequest(LONG.model, LONG.messages, LONG.dialect, temperature=0, max_tokens=max_tokens)
    async for delta in runtime.generate(request, ReleaseRef("release", "content", load_id)):
        result.add(delta)
    return result


def test_full_weights_pushed_into_the_engine_and_back_to_the_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    files = full_weight_files(tiny_model_dir, seed=1, optimiser_bytes=1024)
    shard = next(name for name in files if name.startswith("model-00003"))
    broken = {**full_weight_files(tiny_model_dir, seed=2), shard: b"not safetensors"}
    port = free_port()
    command = [sys.executable, "-m", "tests.helpers.sglang_double", "--model-path", str(tiny_model_dir)]
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

    async def main(double: EngineProcess) -> None:
        runtime = SGLangRuntime(
            double.url, adapter_dir=tmp_path / "loads", model_dir=tiny_model_dir, load_timeout=60, health_interval=0.2
        )
        await runtime.start()
        try:
            base = await runtime.load("base", {})
            base_ids = (await answer(runtime, base)).token_ids
            in_flight = [asyncio.create_task(answer(runtime, base, 24)) for _ in range(3)]
            await asyncio.sleep(0.2)  # they are running or queued in the engine when the push begins
            full = await runtime.load("full", files)
            for result in await asyncio.gather(*in_flight):  # none failed; all on the base's weights
                assert result.token_ids[: len(base_ids)] == base_ids and set(result.token_loads) == {base}
            served = await answer(runtime, full)
            assert served.token_ids != base_ids and set(served.token_loads) == {full}
            late = await answer(runtime, base)  # frozen to the base, served by the full weights: stamped so
            assert late.token_ids == served.token_ids and set(late.token_loads) == {full}
            assert not any(p.name == "training" for p in (tmp_path / "loads" / full).iterdir())

            with pytest.raises(RuntimeFailure, match="as its weights"):
                await runtime.load("broken", broken)
            assert (await answer(runtime, full)).token_ids == served.token_ids  # the engine kept its weights

            await asyncio.to_thread(double.kill)  # back on its base weights once started again
            await asyncio.to_thread(double.start)
            while runtime.restarts < 1:  # the watchdog pushes the resident release before it serves again
                await asyncio.sleep(0.1)
            assert (await answer(runtime, full)).token_ids == served.token_ids

            back = await runtime.load("base again", {})  # a rollback to the base
            assert (await answer(runtime, back)).token_ids == base_ids
            assert (await answer(runtime, base)).token_ids == base_ids
            assert runtime.weights.swaps == 2 and runtime.weights.folder is None  # the restart's push is no swap
            await runtime.unload(full)
            assert not (tmp_path / "loads" / full).exists()
        finally:
            await runtime.close()

    with EngineProcess(command + ["--port", str(port)], port, log_path=tmp_path / "double.log", env=env) as double:
        asyncio.run(asyncio.wait_for(main(double), 240))
