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
the base model. A failed or timed-out load is unloaded again and raises; `unload` unloads.

Supervision: a vLLM that Reef started and that exits (killed, out of memory, an engine fault) is
started again on a fresh port and every adapter this runtime holds is loaded again under its
same name; an attached vLLM that stops answering `/health` gets its adapters back once it
answers again. Meanwhile requests are refused with 503 (`EngineUnavailable`) and a Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping

import aiohttp

from reef.core.chat import ChatRequest, Delta, Finish, FinishReason, TextDelta, ToolCallDelta, Usage
from reef.core.errors import RuntimeFailure
from reef.core.types import ReleaseRef
from reef.runtimes.base import Runtime
from reef.runtimes.engine_common import EngineUnavailable, adapter_files, error_message, load_adapter
from reef.runtimes.upstream_wire import SSEParser, UpstreamProblem, error_text, loads_json
from reef.runtimes.vllm_env import VLLMProcess

if TYPE_CHECKING:
    from reef.config import ServeConfig

log = logging.getLogger("reef.vllm")
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "abort": "error"}


@dataclass
class _Load:
    adapter: Path | None  # the PEFT folder vLLM reads; None: the base model


class VLLMRuntime(Runtime):
    name = "vllm"
    verifies_tokens = True

    def __init__(self, *, process: VLLMProcess | None = None, url: str | None = None, model_name: str | None = None,
                 adapter_dir: Path, default_max_tokens: int = 256, timeout: float = 120.0,
                 load_timeout: float = 120.0, health_interval: float = 1.0, engine_dtype: str | None = None,
                 model_dir: Path | None = None) -> None:
        if (process is None) == (url is None):
            raise ValueError("a vLLM runtime either supervises a process or attaches to a url")
        self.process = process
        self._url = url.rstrip("/").removesuffix("/v1") if url else None
        self.model_name = model_name or (process.served_name if process else None)
        # the base model's folder, for the training process (reef/serve/learning.py); attached, only
        # when the configuration names it (vllm.model_dir: the weights that vLLM serves)
        self.model_dir: Path | None = process.model_dir if process else model_dir
        self.engine_dtype = engine_dtype  # the trainer matches it on a GPU (learner.dtype: auto)
        self.adapter_dir = adapter_dir
        self.default_max_tokens = default_max_tokens
        self.load_timeout = load_timeout
        self.health_interval = health_interval
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
        self._incarnation = secrets.token_hex(4)
        self._counter = itertools.count(1)
        self._loads: dict[str, _Load] = {}
        self._client: aiohttp.ClientSession | None = None
        self._down: str | None = "vLLM is not started"
        self._watchdog: asyncio.Task[None] | None = None
        self._closing = False
        self.restarts = 0  # counters for tests and /reef/status

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.process.url if self.process else str(self._url)

    async def start(self) -> None:
        if self._client is not None:
            return
        self._client = aiohttp.ClientSession(timeout=self._timeout,
                                             connector=aiohttp.TCPConnector(limit=256, limit_per_host=256))
        self.adapter_dir.mkdir(parents=True, exist_ok=True)
        if self.process is not None:
            started = time.monotonic()
            await self.process.start()
            log.info("vLLM healthy on %s after %.1fs (pid %s)", self.url, time.monotonic() - started, self.process.pid)
        elif not await self._healthy():
            raise RuntimeFailure(f"no vLLM answers /health at {self.url}")
        if self.model_name is None:
            self.model_name = await self._base_model()
        self._down = None
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def close(self) -> None:
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watchdog
            self._watchdog = None
        if self.process is not None:
            await self.process.stop()
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        shutil.rmtree(self.adapter_dir, ignore_errors=True)

    def served_models(self) -> list[str]:
        return [self.model_name] if self.model_name else []

    async def _healthy(self) -> bool:
        assert self._client is not None
        try:
            async with self._client.get(f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=10)) as response:
                return response.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

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
        """Restart a dead vLLM (or wait for an attached one to answer again) and reload adapters."""
        failures = 0
        while not self._closing:
            await asyncio.sleep(self.health_interval)
            if self.process is not None:
                if self.process.alive():
                    continue
                self._down = f"vLLM (pid {self.process.pid}) exited with {self.process.process.returncode if self.process.process else '?'}; restarting"
                log.error("%s; log tail:\n%s", self._down, self.process.log_tail(10))
                try:
                    await self.process.stop(grace=2)  # its engine core and workers too
                    await self.process.start()
                    await self._reload_adapters()
                except Exception as exc:  # try again next round
                    log.error("restarting vLLM failed: %s", exc)
                    continue
            else:
                if await self._healthy():
                    failures = 0
                    continue
                failures += 1
                if failures < 3:
                    continue
                self._down = f"vLLM at {self.url} does not answer /health"
                log.error("%s", self._down)
                while not self._closing and not await self._healthy():
                    await asyncio.sleep(self.health_interval)
                try:
                    await self._reload_adapters()
                except Exception as exc:
                    log.error("reloading adapters into vLLM failed: %s", exc)
                    continue
                failures = 0
            self.restarts += 1
            self._down = None
            log.warning("vLLM serving again on %s with %d adapter(s) reloaded", self.url,
                        sum(1 for load in self._loads.values() if load.adapter))

    async def _reload_adapters(self) -> None:
        for name, load in list(self._loads.items()):
            if load.adapter is not None and name in self._loads:
                with contextlib.suppress(RuntimeFailure):  # an attached vLLM may still hold it
                    await self._post_adapter("unload", {"lora_name": name})
                await self._post_adapter("load", {"lora_name": name, "lora_path": str(load.adapter)})

    # -- releases ----------------------------------------------------------------------------

    async def load(self, content_id: str, files: Mapping[str, bytes]) -> str:
        """A release without weights serves the base model; one with a PEFT LoRA adapter gets it
        loaded into vLLM under a fresh name, which is also its runtime_load_id."""
        name = f"reef-{self._incarnation}-{next(self._counter)}"
        adapter = adapter_files(files)
        if adapter is None:
            self._loads[name] = _Load(None)
            return name
        if self._down:
            raise EngineUnavailable(f"cannot load content {content_id}: {self._down}")
        folder = self.adapter_dir / name
        await load_adapter("vLLM", content_id, folder, adapter, timeout=self.load_timeout,
                           load=lambda: self._post_adapter("load", {"lora_name": name, "lora_path": str(folder)}),
                           unload=lambda: self._post_adapter("unload", {"lora_name": name}))
        self._loads[name] = _Load(folder)
        return name

    async def unload(self, runtime_load_id: str) -> None:
        load = self._loads.pop(runtime_load_id, None)
        if load is None or load.adapter is None:
            return
        try:
            await self._post_adapter("unload", {"lora_name": runtime_load_id})
        except RuntimeFailure as exc:  # a restarting vLLM forgets it anyway: it is not reloaded
            log.warning("unloading %s from vLLM: %s", runtime_load_id, exc)
        finally:
            shutil.rmtree(load.adapter, ignore_errors=True)

    async def _post_adapter(self, action: str, body: dict[str, str]) -> None:
        assert self._client is not None
        try:
            async with self._client.post(f"{self.url}/v1/{action}_lora_adapter", json=body) as response:
                text = await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise RuntimeFailure(f"vLLM {action}_lora_adapter failed: {type(exc).__name__} {exc}") from None
        if response.status != 200:
            raise RuntimeFailure(f"vLLM {action}_lora_adapter answered {response.status}: {error_message(text)}")

    def resident_adapters(self) -> list[str]:
        """The adapters this runtime has loaded into vLLM (their load names), for /reef/status."""
        return sorted(name for name, load in self._loads.items() if load.adapter is not None)

    async def engine_adapters(self) -> list[str]:
        """The adapters vLLM itself lists in /v1/models (tests; /reef/status uses the above)."""
        return sorted(str(m["id"]) for m in (await self._get_json("/v1/models")).get("data") or () if m.get("parent"))

    # -- generation ----------------------------------------------------------------------------

    def _body(self, request: ChatRequest, model: str) -> dict[str, Any]:
        from reef.runtimes.chatml import chat_messages

        body: dict[str, Any] = {
            "model": model, "messages": chat_messages(request), "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens or self.default_max_tokens,
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "top_p": 1.0 if request.top_p is None else request.top_p,
            "logprobs": True, "top_logprobs": 0, "return_token_ids": True,
        }
        if request.seed is not None:
            body["seed"] = request.seed % 2**63
        if request.stop:
            body["stop"] = list(request.stop)
        return body

    def _model_of(self, release: ReleaseRef) -> str:
        load_id = release.runtime_load_id
        load = self._loads.get(load_id) if load_id else None
        if load is None:
            raise RuntimeFailure(f"runtime load {load_id!r} of release {release.release_id} is not loaded here")
        return load_id if load.adapter is not None else str(self.model_name)  # type: ignore[return-value]

    async def _unavailable(self, what: str) -> RuntimeFailure:
        """A 503 when vLLM is down (a connection reset can arrive a moment before its process is
        seen to exit, so that is waited for up to a second; an attached vLLM is asked /health),
        else a 502 saying `what`."""
        for _ in range(10):
            if self._down or (self.process is not None and not self.process.alive()):
                return EngineUnavailable(f"vLLM is not serving ({self._down or 'it exited'}); retry shortly")
            if self.process is None:
                break
            await asyncio.sleep(0.1)
        if self.process is None and not await self._healthy():
            return EngineUnavailable(f"vLLM at {self.url} does not answer /health; retry shortly")
        return RuntimeFailure(f"vLLM at {self.url} {what}")

    async def generate(self, request: ChatRequest, release: ReleaseRef) -> AsyncIterator[Delta]:
        from reef.runtimes.chatml import TextStream

        if self._client is None:
            raise RuntimeFailure("the vLLM runtime is not started")
        if self._down:
            raise EngineUnavailable(f"vLLM is not serving ({self._down}); retry shortly")
        model = self._model_of(release)
        load_id = release.runtime_load_id
        watch_tools = bool(request.tools) and request.tool_choice != "none"
        text = ""
        stream = TextStream(lambda _ids: text, (), watch_tools)  # vLLM applies the stop strings
        ids: list[int] = []
        prompt_ids: tuple[int, ...] = ()
        usage = Usage()
        reason: FinishReason | None = None
        try:
            async with self._client.post(f"{self.url}/v1/chat/completions", json=self._body(request, model)) as response:
                if response.status != 200:
                    raw = await response.text()
                    if response.status == 404 and self._down is None and load_id in self._loads:
                        raise await self._unavailable("does not hold the adapter (reloading)")
                    if 400 <= response.status < 500:
                        raise RuntimeFailure(f"vLLM refused the request ({response.status}): {error_message(raw)}",
                                             status=response.status, error_type="invalid_request_error")
                    raise await self._unavailable(f"failed ({response.status}): {error_message(raw)}")
                events = SSEParser()
                async for piece in response.content.iter_any():
                    for _event, data in events.feed(piece):
                        if data.strip() == "[DONE]":
                            continue
                        chunk = loads_json(data)
                        if chunk.get("error"):
                            raise UpstreamProblem(f"reported an error mid-stream: {error_text(chunk)[0]}")
                        if chunk.get("prompt_token_ids"):
                            prompt_ids = tuple(chunk["prompt_token_ids"])
                        if chunk.get("usage"):
                            u = chunk["usage"]
                            usage = Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0))
                        for choice in chunk.get("choices") or ():
                            tokens = tuple(int(t) for t in choice.get("token_ids") or ())
                            logprobs = tuple(float(c["logprob"]) for c in (choice.get("logprobs") or {}).get("content") or ())
                            piece = (choice.get("delta") or {}).get("content") or ""
                            text += piece
                            if tokens or piece:
                                ids.extend(tokens)
                                released = stream.push(ids)
                                if len(logprobs) != len(tokens):  # never pair a token with another's log-prob
                                    tokens, logprobs = (), ()
                                if tokens or released:
                                    yield TextDelta(released, tokens, logprobs, load_id)
                            if choice.get("finish_reason"):
                                reason = _FINISH.get(choice["finish_reason"], "stop")
        except RuntimeFailure:
            raise
        except UpstreamProblem as exc:
            raise RuntimeFailure(f"vLLM {exc}") from None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
            raise await self._unavailable(f"broke the answer off ({type(exc).__name__})") from None
        if reason is None:
            raise await self._unavailable("ended the stream before the answer finished")
        rest, calls = stream.finish(ids)
        if rest:
            yield TextDelta(rest, (), (), load_id)
        for index, call in enumerate(calls):
            yield ToolCallDelta(call, index)
        if not usage.completion_tokens:
            usage = Usage(len(prompt_ids), len(ids))
        yield Finish("tool_calls" if calls else reason, usage, model=self.model_name, prompt_token_ids=prompt_ids)

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
    common = {"adapter_dir": adapters, "default_max_tokens": v.default_max_tokens, "timeout": v.timeout,
              "load_timeout": v.load_timeout}
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
    args = ["--enable-lora", "--max-lora-rank", str(v.max_lora_rank), "--max-loras", str(v.max_loras),
            "--max-model-len", str(v.max_model_len), "--dtype", engine_dtype(config), *v.extra_args]
    if not any(a.startswith("--logprobs-mode") for a in v.extra_args):
        # the log-probs of the distribution each token was drawn from (temperature and top-p
        # applied; the model's own when greedy), as the embedded runtime records and the trainer assumes
        args += ["--logprobs-mode", "processed_logprobs"]
    process = VLLMProcess(python, Path(model_dir), name, args=args, env={"VLLM_CPU_KVCACHE_SPACE": str(v.kv_cache_gb)},
                          log_path=cache / "vllm-logs" / f"vllm-{os.getpid()}.log", startup_timeout=v.startup_timeout)
    if progress:
        progress(f"starting vLLM on {model_dir} (about a minute on a CPU; log {process.log_path})")
    return VLLMRuntime(process=process, engine_dtype=engine_dtype(config), **common)  # type: ignore[arg-type]


def engine_dtype(config: ServeConfig) -> str:
    """`vllm.dtype: auto`: float32 while the learner is on, bfloat16 otherwise. Measured on
    SmolLM2 (docs/engines.md): a bf16 engine's log-probs are 0.05 nats a token from the fp32
    trainer's (1.7% of tokens masked by the clip before any step), an fp32 engine's 1e-4, for 25%
    more serving time; the CPU build Reef installs serves fp32 as readily as bf16."""
    if config.vllm.dtype != "auto":
        return config.vllm.dtype
    return "float32" if config.learner.enabled else "bfloat16"
