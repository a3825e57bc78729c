"""The vLLM runtime: a vLLM OpenAI server that Reef starts and supervises (or attaches to), with
LoRA adapters hot-loaded per release, and token ids and log-probs captured into every record.

Every request goes to vLLM as a streamed chat completion (whether or not the client streams)
with `logprobs: true, top_logprobs: 0` and `return_token_ids: true`: each chunk carries the
token ids it decoded and their log-probs, the first one the prompt's token ids. The prompt is
Reef's own ChatML (`chatml.chat_messages`: tools as a system-prompt instruction, tool calls
parsed back out of the text), so the engine sees what the embedded runtime would give the model.
Clients never get the log-probs: they go to the record only.

Releases: `load` writes a release's LoRA adapter as a PEFT folder and loads it into vLLM under a
fresh name, and that name is the `runtime_load_id`; a request frozen to a release is sent with
`model` = that name, so every token it gets was produced by that adapter, and each `TextDelta`
is stamped with it by construction (`verifies_tokens`). A release without weights is a load of
the base model. A failed or timed-out load is unloaded again and raises; `unload` unloads. A
full-weight release is pushed into vLLM instead (`_push_weights`, engine_weights.py): one at a
time, between requests, the base pushed back for a rollback to it.

Supervision: a vLLM that Reef started and that exits (killed, out of memory, an engine fault) is
started again on a fresh port and every adapter this runtime holds is loaded again under its
same name; an attached vLLM that stops answering `/health` gets its adapters back once it
answers again. Meanwhile requests are refused with 503 (`EngineUnavailable`) and a Retry-After.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import aiohttp

from reef.core.chat import ChatRequest, Delta, FinishReason, TextDelta, Usage
from reef.core.errors import RuntimeFailure
from reef.core.types import ReleaseRef
from reef.runtimes.chatml import TextStream
from reef.runtimes.engine_base import EngineAnswer, EngineRuntime
from reef.runtimes.engine_common import EngineUnavailable, error_message
from reef.runtimes.upstream_wire import error_text
from reef.runtimes.vllm_env import VLLMProcess

if TYPE_CHECKING:
    from reef.config import ServeConfig

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "abort": "error"}


class _ChatAnswer(EngineAnswer):
    """A streamed chat completion: each chunk's choices carry the token ids they decoded, with
    their log-probs and text; the first chunk carries the prompt's token ids."""

    def __init__(self, load_id: str, model: str, watch_tools: bool) -> None:
        self.text = ""
        super().__init__(load_id, TextStream(lambda _ids: self.text, (), watch_tools))  # vLLM applies the stop strings
        self.model = model

    def read(self, chunk: dict[str, Any]) -> Iterator[Delta]:
        if chunk.get("prompt_token_ids"):
            self.prompt_ids = tuple(chunk["prompt_token_ids"])
        if chunk.get("usage"):
            u = chunk["usage"]
            self.usage = Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0))
        for choice in chunk.get("choices") or ():
            tokens = tuple(int(t) for t in choice.get("token_ids") or ())
            logprobs = tuple(float(c["logprob"]) for c in (choice.get("logprobs") or {}).get("content") or ())
            piece = (choice.get("delta") or {}).get("content") or ""
            self.text += piece
            if tokens or piece:
                self.ids.extend(tokens)
                released = self.stream.push(self.ids)
                if len(logprobs) != len(tokens):  # never pair a token with another's log-prob
                    tokens, logprobs = (), ()
                if tokens or released:
                    yield TextDelta(released, tokens, logprobs, self.load_id)
            if choice.get("finish_reason"):
                self.reason = _FINISH.get(choice["finish_reason"], "stop")

    def final_usage(self) -> Usage:
        return self.usage if self.usage.completion_tokens else Usage(len(self.prompt_ids), len(self.ids))


class VLLMRuntime(EngineRuntime[_ChatAnswer]):
    name = "vllm"
    engine = "vLLM"
    log = logging.getLogger("reef.vllm")
    api_prefix = "/v1"
    generate_route = "/v1/chat/completions"

    def __init__(
        self,
        *,
        process: VLLMProcess | None = None,
        url: str | None = None,
        model_name: str | None = None,
        adapter_dir: Path,
        default_max_tokens: int = 256,
        timeout: float = 120.0,
        load_timeout: float = 120.0,
        health_interval: float = 1.0,
        engine_dtype: str | None = None,
        model_dir: Path | None = None,
    ) -> None:
        if (process is None) == (url is None):
            raise ValueError("a vLLM runtime either supervises a process or attaches to a url")
        # attached, the base model's folder is known only when the configuration names it
        # (vllm.model_dir: the weights that vLLM serves)
        super().__init__(
            url=url.rstrip("/").removesuffix("/v1") if url else None,
            adapter_dir=adapter_dir,
            model_name=model_name or (process.served_name if process else None),
            model_dir=process.model_dir if process else model_dir,
            engine_dtype=engine_dtype,
            default_max_tokens=default_max_tokens,
            timeout=timeout,
            load_timeout=load_timeout,
            health_interval=health_interval,
            down="vLLM is not started",
        )
        self.process = process

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.process.url if self.process else str(self._url)

    async def _attach(self) -> None:
        if self.process is not None:
            started = time.monotonic()
            await self.process.start()
            self.log.info(
                "vLLM healthy on %s after %.1fs (pid %s)", self.url, time.monotonic() - started, self.process.pid
            )
        elif not await self._healthy():
            raise RuntimeFailure(f"no vLLM answers /health at {self.url}")
        if self.model_name is None:
            self.model_name = await self._base_model()

    async def _let_go(self) -> None:
        if self.process is not None:
            await self.process.stop()

    async def _base_model(self) -> str:
        for model in (await self._get_json("/v1/models")).get("data") or ():
            if not model.get("parent"):
                return str(model["id"])
        raise RuntimeFailure(f"vLLM at {self.url} lists no base model")

    async def _get_json(self, path: str) -> Any:
        assert self._client is not None
        async with self._client.get(f"{self.url}{path}") as response:
            response.raise_for_status()
            return await response.json()

    async def _watch(self) -> None:
        """Restart a dead vLLM and reload its adapters (an attached one is watched as any engine)."""
        if self.process is None:
            await super()._watch()
            return
        while not self._closing:
            await asyncio.sleep(self.health_interval)
            if self.process.alive():
                continue
            self._down = f"vLLM (pid {self.process.pid}) exited with {self.process.process.returncode if self.process.process else '?'}; restarting"
            self.log.error("%s; log tail:\n%s", self._down, self.process.log_tail(10))
            try:
                await self.process.stop(grace=2)  # its engine core and workers too
                await self.process.start()
                await self._restore()  # on the resident full weights again, then the adapters
            except Exception as exc:  # try again next round
                self.log.error("restarting vLLM failed: %s", exc)
                continue
            self._serving_again()

    async def _push_weights(self, folder: Path) -> None:
        """vLLM's disk path (its RL and dev routes, VLLM_SERVER_DEV_MODE=1): pause once the requests
        in flight finished, reload the weights in place from `folder` on every worker, drop the
        prefix cache, resume (whatever failed: a paused vLLM serves nobody)."""
        await self.post_json("/pause", mode="wait")
        try:
            await self.post_json(
                "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
            )
            await self.post_json("/reset_prefix_cache")
        finally:
            await self.post_json("/resume")

    async def engine_adapters(self) -> list[str]:
        """The adapters vLLM itself lists in /v1/models (tests; /reef/status uses resident_adapters)."""
        return sorted(str(m["id"]) for m in (await self._get_json("/v1/models")).get("data") or () if m.get("parent"))

    # -- generation ----------------------------------------------------------------------------

    def _answer(self, request: ChatRequest, release: ReleaseRef) -> _ChatAnswer:
        load_id = release.runtime_load_id
        if load_id is None or load_id not in self._loads:
            raise RuntimeFailure(f"runtime load {load_id!r} of release {release.release_id} is not loaded here")
        model = load_id if self._loads[load_id] is not None else str(self.model_name)
        return _ChatAnswer(load_id, model, bool(request.tools) and request.tool_choice != "none")

    def _body(self, request: ChatRequest, answer: _ChatAnswer) -> dict[str, Any]:
        from reef.runtimes.chatml import chat_messages

        body: dict[str, Any] = {
            "model": answer.model,
            "messages": chat_messages(request),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens or self.default_max_tokens,
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "top_p": 1.0 if request.top_p is None else request.top_p,
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
        }
        if request.seed is not None:
            body["seed"] = request.seed % 2**63
        if request.stop:
            body["stop"] = list(request.stop)
        return body

    async def _refused(self, status: int, raw: str, answer: _ChatAnswer) -> RuntimeFailure:
        if status == 404 and self._down is None and answer.load_id in self._loads:
            return await self._unavailable("does not hold the adapter (reloading)")
        if 400 <= status < 500:
            return RuntimeFailure(
                f"vLLM refused the request ({status}): {error_message(raw)}",
                status=status,
                error_type="invalid_request_error",
            )
        return await self._unavailable(f"failed ({status}): {error_message(raw)}")

    async def _stream_error(self, data: str, chunk: dict[str, Any], answer: _ChatAnswer) -> RuntimeFailure:
        return RuntimeFailure(f"vLLM reported an error mid-stream: {error_text(chunk)[0]}")

    async def _unavailable(self, what: str) -> RuntimeFailure:
        """A 503 when vLLM is down (a connection reset can arrive a moment before the process Reef
        supervises is seen to exit, so that is waited for up to a second), else a 502 saying `what`."""
        if self.process is None:
            return await super()._unavailable(what)
        for _ in range(10):
            if self._down or not self.process.alive():
                return EngineUnavailable(f"vLLM is not serving ({self._down or 'it exited'}); retry shortly")
            await asyncio.sleep(0.1)
        return RuntimeFailure(f"vLLM at {self.url} {what}")

    async def count_tokens(self, request: ChatRequest) -> int:
        from reef.runtimes.chatml import chat_messages

        if self._client is None:
            raise RuntimeFailure("the vLLM runtime is not started")
        body = {"model": self.model_name, "messages": chat_messages(request), "add_generation_prompt": True}
        try:
            async with self._client.post(f"{self.url}/tokenize", json=body) as response:
                raw = await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise await self._unavailable(f"could not count tokens ({type(exc).__name__})") from None
        if response.status != 200:
            raise await self._unavailable(f"could not count tokens ({response.status}): {error_message(raw)}")
        return int(json.loads(raw)["count"])


def build_vllm_runtime(config: ServeConfig, progress: Callable[[str], None] | None = None) -> VLLMRuntime:
    """The runtime `runtime: vllm` asks for: attached to `vllm.url`, or a vLLM Reef starts (its
    environment installed first if absent, the model folder converted first if it is SmolLM2's)."""
    from reef.runtimes.model_files import default_cache_dir

    v = config.vllm
    cache = config.embedded.cache_dir or default_cache_dir()
    adapters = cache / "vllm-adapters" / f"{os.getpid()}-{secrets.token_hex(3)}"
    common = {
        "adapter_dir": adapters,
        "default_max_tokens": v.default_max_tokens,
        "timeout": v.timeout,
        "load_timeout": v.load_timeout,
    }
    if v.url:
        return VLLMRuntime(url=v.url, model_name=v.model_name, model_dir=v.model_dir, **common)  # type: ignore[arg-type]
    from reef.runtimes.model_files import ensure_embedded_model
    from reef.runtimes.vllm_env import default_env_dir, ensure_vllm_env

    model_dir = v.model_dir or config.embedded.model_dir
    name = v.model_name or (model_dir.name if model_dir else "smollm2-135m-instruct")
    if model_dir is None:
        from reef.extras import require

        require("converting SmolLM2 for the vLLM runtime (without vllm.model_dir)", "embedded")
        model_dir = ensure_embedded_model(cache, progress)
    python = ensure_vllm_env(v.env_dir or default_env_dir(cache), progress)
    args = [
        "--enable-lora",
        "--max-lora-rank",
        str(v.max_lora_rank),
        "--max-loras",
        str(v.max_loras),
        "--max-model-len",
        str(v.max_model_len),
        "--dtype",
        engine_dtype(config),
        *v.extra_args,
    ]
    if not any(a.startswith("--logprobs-mode") for a in v.extra_args):
        # the log-probs of the distribution each token was drawn from (temperature and top-p
        # applied; the model's own when greedy), as the embedded runtime records and the trainer assumes
        args += ["--logprobs-mode", "processed_logprobs"]
    process = VLLMProcess(
        python,
        Path(model_dir),
        name,
        args=args,
        env={"VLLM_CPU_KVCACHE_SPACE": str(v.kv_cache_gb), **_full_weight_routes(config)},
        log_path=cache / "vllm-logs" / f"vllm-{os.getpid()}.log",
        startup_timeout=v.startup_timeout,
    )
    if progress:
        progress(f"starting vLLM on {model_dir} (about a minute on a CPU; log {process.log_path})")
    return VLLMRuntime(process=process, engine_dtype=engine_dtype(config), **common)  # type: ignore[arg-type]


def _full_weight_routes(config: ServeConfig) -> dict[str, str]:
    """vLLM's weight-reload routes (`/pause`, `/collective_rpc`, `/reset_prefix_cache`,
    `/resume`) are development routes: on only where the learner trains full weights."""
    return {"VLLM_SERVER_DEV_MODE": "1"} if getattr(config.learner, "weights", "lora") == "full" else {}


def engine_dtype(config: ServeConfig) -> str:
    """`vllm.dtype: auto`: float32 while the learner is on, bfloat16 otherwise. Measured on
    SmolLM2 (docs/engines.md): a bf16 engine's log-probs are 0.05 nats a token from the fp32
    trainer's (1.7% of tokens masked by the clip before any step), an fp32 engine's 1e-4, for 25%
    more serving time; the CPU build Reef installs serves fp32 as readily as bf16."""
    if config.vllm.dtype != "auto":
        return config.vllm.dtype
    return "float32" if config.learner.enabled else "bfloat16"
