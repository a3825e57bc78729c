"""`reef serve --runtime sglang` against the SGLang double (tests/helpers/sglang_double.py: SGLang's
native API over the tiny model, transformers + peft), through the engine contract that
bench/engine_contract.py also runs against a real SGLang and vLLM on a GPU
(tests/helpers/engine_contract.py): both SDKs, plain and streaming, records with the engine's
token ids and log-probs verified against the frozen release; a LoRA release served by the next
request, rolled back and unloaded from the engine; a corrupt adapter refused while the old release
keeps serving; the engine killed with SIGKILL answered with 503s in the client's dialect until it
is restarted and has the adapter again under the same name.

Plus what needs no server: the two shapes of SGLang's streamed log-probs, and the settings.
One double and one Reef for the module (about 10 s each to start on 2 cores).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from aiohttp import web

from reef.config import load_config
from reef.core.errors import InvalidInput
from tests.helpers.engine_contract import (
    HEADERS,
    USER,
    Contract,
    adapter_lifecycle,
    engine_restart,
    make_releases,
    plain_answers,
    status_names_the_engine,
    streamed_answers,
)
from tests.helpers.engine_process import EngineProcess
from tests.helpers.reef_server import ROOT, ReefServer, free_port


@pytest.fixture(scope="module")
def contract(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Contract]:
    work = tmp_path_factory.mktemp("reef-sglang")
    releases = make_releases(tiny_model_dir, work / "state", work)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "tests.helpers.sglang_double",
        "--model-path",
        str(tiny_model_dir),
        "--port",
        str(port),
        "--enable-lora",
        "--max-lora-rank",
        "16",
    ]
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    started = time.monotonic()
    with EngineProcess(command, port, log_path=work / "sglang-double.log", env=env, startup_timeout=120) as double:
        print(f"\nSGLang double healthy after {time.monotonic() - started:.1f}s")
        settings = {
            "state_dir": str(work / "state"),
            "runtime": "sglang",
            "learner": {"enabled": False},
            "sglang": {
                "url": double.url,
                "model_dir": str(tiny_model_dir),
                "model_name": "tiny",
                "default_max_tokens": 8,
                "load_timeout": 60,
            },
        }
        started = time.monotonic()
        with ReefServer(work, settings, env={"REEF_CACHE_DIR": str(work / "cache")}, startup_timeout=120) as reef:
            print(f"reef serve --runtime sglang healthy after {time.monotonic() - started:.1f}s")
            yield Contract(
                reef.url,
                "sglang",
                double.url,
                releases,
                kill_engine=double.kill,
                restart_engine=lambda: restart_incremental(double),
                timeout=60,
                back_within=120,
            )


def restart_incremental(double: EngineProcess) -> None:
    """Start the killed double again streaming SGLang's other way (only each chunk's new tokens,
    `--incremental-streaming-output`): the restart check's same answer after the restart then
    also shows that Reef reads both shapes alike."""
    double.command.append("--incremental-streaming-output")
    double.start()


@pytest.mark.slow
def test_plain_answers_in_both_dialects_carry_sglangs_tokens_and_logprobs(contract: Contract) -> None:
    print(plain_answers(contract))


@pytest.mark.slow
def test_streams_in_both_dialects_are_recorded_and_verified(contract: Contract) -> None:
    print(streamed_answers(contract))


@pytest.mark.slow
def test_models_and_status_name_the_engine(contract: Contract) -> None:
    print(status_names_the_engine(contract))


@pytest.mark.slow
def test_an_adapter_release_is_served_rolled_back_and_unloaded(contract: Contract) -> None:
    print(adapter_lifecycle(contract))


@pytest.mark.slow
def test_an_adapter_sglang_lost_between_two_health_checks_is_loaded_again(contract: Contract) -> None:
    """An SGLang that restarted faster than the watchdog looks holds none of Reef's adapters:
    the request that finds its adapter gone gets a 503, and the adapter is loaded again under
    its name (here it is unloaded behind Reef's back, which SGLang cannot tell from a restart)."""
    load = contract.serve("adapter")
    tuned_text, _ = contract.greedy()
    assert httpx.post(f"{contract.engine_url}/unload_lora_adapter", json={"lora_name": load}).status_code == 200

    def ask() -> httpx.Response:
        body = {"model": contract.model, "messages": USER, "max_tokens": 8, "temperature": 0}
        return httpx.post(f"{contract.reef_url}/v1/chat/completions", json=body, headers=HEADERS, timeout=60)

    first = ask()
    assert first.status_code == 503 and first.headers.get("retry-after"), first.text
    deadline = time.monotonic() + 30
    while ask().status_code != 200:
        assert time.monotonic() < deadline, "the lost adapter was not loaded again"
        time.sleep(0.2)
    assert contract.greedy()[0] == tuned_text and contract.engine_holds(load)


@pytest.mark.slow
def test_a_killed_engine_is_answered_with_503_until_it_is_back_with_the_adapter(contract: Contract) -> None:
    print(engine_restart(contract))


# -- no server ---------------------------------------------------------------------------------


def test_streamed_logprobs_are_read_whether_sglang_sends_them_all_or_only_the_new_ones() -> None:
    from reef.runtimes.sglang import new_tokens
    from reef.runtimes.upstream_wire import UpstreamProblem

    cumulative = {"completion_tokens": 3, "output_token_logprobs": [[-0.5, 7, None], [-1.0, 8, None], [-2.0, 9, None]]}
    assert new_tokens(cumulative, 1) == ([8, 9], [-1.0, -2.0])
    incremental = {"completion_tokens": 3, "output_token_logprobs": [[-1.0, 8, None], [-2.0, 9, None]]}
    assert new_tokens(incremental, 1) == ([8, 9], [-1.0, -2.0])
    assert new_tokens({"completion_tokens": 0}, 0) == ([], [])
    with pytest.raises(UpstreamProblem):
        new_tokens({"completion_tokens": 5, "output_token_logprobs": [[-1.0, 8, None]]}, 1)


def test_the_settings_build_an_attached_runtime_that_knows_its_model_folder(tmp_path: Path) -> None:
    from reef.runtimes.factory import build_runtime

    env = {
        "REEF_RUNTIME": "sglang",
        "REEF_SGLANG__URL": "http://127.0.0.1:30000/",
        "REEF_SGLANG__MODEL_DIR": str(tmp_path / "model"),
        "REEF_SGLANG__ADAPTER_DIR": str(tmp_path / "adapters"),
    }
    runtime = build_runtime(load_config(None, env=env))
    assert (runtime.name, runtime.verifies_tokens, runtime.url) == ("sglang", True, "http://127.0.0.1:30000")
    assert runtime.model_dir == tmp_path / "model"  # the learner trains the weights SGLang serves
    assert runtime.adapter_dir.parent == tmp_path / "adapters"
    with pytest.raises(ValueError, match="sglang.url"):
        build_runtime(load_config(None, env={"REEF_RUNTIME": "sglang"}))
    with pytest.raises(InvalidInput, match="REEF_SGLANG__NO_SUCH names no setting"):
        load_config(None, env={"REEF_SGLANG__NO_SUCH": "1"})


def test_a_tool_call_sglang_writes_is_answered_as_a_tool_call(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The tool-call path, on tokens the tiny model would never write: a scripted `/generate`
    (SGLang's stream shape) whose tokens spell a `<tool_call>` block and the stop token. Also
    what the runtime sends: Reef's ChatML prompt ids, the stop ids, neutral sampling defaults."""
    from reef.core.chat import ChatRequest, Finish, Message, TextDelta, Tool, ToolCallDelta
    from reef.core.types import ReleaseRef
    from reef.runtimes.chatml import prompt_ids
    from reef.runtimes.sglang import SGLangRuntime

    weather = Tool("get_weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}}})
    request = ChatRequest("m", (Message("user", "Weather in Paris?"),), "openai", tools=(weather,), max_tokens=64)

    async def scenario() -> tuple[list[Any], dict[str, Any], list[int]]:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
        answer = tokenizer(
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', add_special_tokens=False
        )["input_ids"] + [2]
        async with ScriptedSGLang(answer) as engine:
            runtime = SGLangRuntime(engine.url, adapter_dir=tmp_path / "adapters", model_dir=tiny_model_dir)
            await runtime.start()
            try:
                load = await runtime.load("content", {})
                deltas = [d async for d in runtime.generate(request, ReleaseRef("r", "content", load))]
            finally:
                await runtime.close()
        assert engine.bodies[0]["input_ids"] == prompt_ids(tokenizer, request)
        return deltas, engine.bodies[0], answer

    deltas, body, answer = asyncio.run(scenario())
    text = [d for d in deltas if isinstance(d, TextDelta)]
    calls = [d.call for d in deltas if isinstance(d, ToolCallDelta)]
    finish = deltas[-1]
    assert "".join(d.text for d in text) == ""  # the block is held back and parsed, not shown as text
    assert [t for d in text for t in d.token_ids] == answer and all(d.runtime_load_id for d in text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert isinstance(finish, Finish) and finish.reason == "tool_calls"
    assert finish.usage.completion_tokens == len(answer)
    params = body["sampling_params"]
    assert body["return_logprob"] is True and body["stream"] is True and "lora_path" not in body
    assert params["max_new_tokens"] == 64 and params["top_k"] == -1 and 2 in params["stop_token_ids"]


class ScriptedSGLang:
    """A scripted SGLang `/generate` that streams `answer` in SGLang's shape (for the tool-call
    path only: the contract runs against the double, a real model)."""

    def __init__(self, answer: list[int]) -> None:
        self.answer = answer
        self.bodies: list[dict[str, Any]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> ScriptedSGLang:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/get_model_info", self.model_info)
        app.router.add_post("/generate", self.generate)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response()

    async def model_info(self, _request: web.Request) -> web.Response:
        return web.json_response({"model_path": "scripted"})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for n in range(1, len(self.answer) + 1):
            finish = {"type": "stop", "matched": 2} if n == len(self.answer) else None
            meta = {
                "finish_reason": finish,
                "prompt_tokens": 9,
                "completion_tokens": n,
                "output_token_logprobs": [[-0.25, t, None] for t in self.answer[:n]],
            }
            await response.write(b"data: " + json.dumps({"text": "", "meta_info": meta}).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response
