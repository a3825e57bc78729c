"""A full-weight release pushed into a REAL vLLM (the CPU build, its disk path: `/pause` ->
`/collective_rpc reload_weights` -> `/reset_prefix_cache` -> `/resume`) under concurrent load:
no request fails, requests in flight finish on the base's weights, the answers change to the
release's; vLLM killed with the release resident comes back on it (the supervisor restarts vLLM
and pushes the resident weights again); a release without weights pushes the base back.

One vLLM (about a minute to start here, and again after the kill). Needs the vLLM environment
(`scripts/setup --vllm`); without it the test skips.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from reef.core.chat import ChatRequest, ChatResult, Message
from reef.core.types import ReleaseRef
from reef.runtimes.vllm import VLLMRuntime
from reef.runtimes.vllm_env import VLLMProcess, default_env_dir, env_ready
from tests.helpers.full_weights import full_weight_files

pytestmark = pytest.mark.slow
ENV = Path(os.environ["REEF_VLLM_ENV"]) if os.environ.get("REEF_VLLM_ENV") else default_env_dir()
ASK = ChatRequest(model="m", messages=(Message("user", "Name a colour."),), dialect="openai", temperature=0)


async def answer(runtime: VLLMRuntime, load_id: str, max_tokens: int = 8) -> ChatResult:
    result = ChatResult()
    request = ChatRequest(ASK.model, ASK.messages, ASK.dialect, temperature=0, max_tokens=max_tokens)
    async for delta in runtime.generate(request, ReleaseRef("release", "content", load_id)):
        result.add(delta)
    return result


def test_a_full_weight_release_pushed_into_vllm_under_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    if not env_ready(ENV):
        pytest.skip(f"no vLLM environment at {ENV}: run `scripts/setup --vllm`")
    from tests.helpers.vllm_model import build_vllm_tiny_model

    model = build_vllm_tiny_model(tiny_model_dir, tmp_path / "model")
    files = full_weight_files(model, seed=1, optimiser_bytes=1024)
    process = VLLMProcess(
        ENV / "bin" / "python",
        model,
        "tiny",
        args=["--max-model-len", "512", "--dtype", "float32", "--enforce-eager"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"},
        log_path=tmp_path / "vllm.log",
        startup_timeout=300,
    )

    async def main() -> None:
        runtime = VLLMRuntime(process=process, adapter_dir=tmp_path / "loads", load_timeout=120)
        await runtime.start()
        try:
            base = await runtime.load("base", {})
            base_ids = (await answer(runtime, base)).token_ids
            load = [asyncio.create_task(answer(runtime, base, 16)) for _ in range(8)]
            await asyncio.sleep(0.3)
            started = time.monotonic()
            full = await runtime.load("full", files)
            print(f"\nvLLM full-weight push: {time.monotonic() - started:.2f}s")
            results = await asyncio.gather(*load, return_exceptions=True)
            assert not [r for r in results if isinstance(r, BaseException)]  # 0 failed requests
            assert all(r.token_ids[: len(base_ids)] == base_ids for r in results if isinstance(r, ChatResult))
            full_ids = (await answer(runtime, full)).token_ids
            assert full_ids != base_ids

            process.process.kill()  # the supervisor restarts vLLM, on the base weights, and pushes the release again
            deadline = time.monotonic() + 300
            while runtime.restarts < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert runtime.restarts == 1, process.log_tail()
            assert (await answer(runtime, full)).token_ids == full_ids

            back = await runtime.load("base again", {})  # a rollback to the base
            assert (await answer(runtime, back)).token_ids == base_ids
        finally:
            await runtime.close()

    asyncio.run(main())
