"""The SGLang runtime: Reef attaches to a running SGLang server (it neither installs nor starts
SGLang), hot-loads each release's LoRA adapter into it, and records SGLang's own token ids and
log-probs with every answer.

Requests go to SGLang's native `POST /generate` as token ids, always streamed: Reef renders the
prompt itself with its ChatML (`chatml.prompt_ids`: tools as a system-prompt instruction, tool
calls parsed back out of the text) and the model's tokenizer, so SGLang is given exactly the
tokens the embedded runtime would give its model, and the record's prompt ids are Reef's own.
`return_logprob: true` brings `meta_info.output_token_logprobs`, one `[logprob, token_id, text]`
per generated token; those ids are the answer (decoded here, with the same tokenizer), and the
log-probs go to the record only.

Releases: `load` writes a release's LoRA adapter as a PEFT folder and calls
`/load_lora_adapter` with a fresh name, which is the `runtime_load_id`; a request frozen to the
release is sent with `lora_path` = that name, so every token it gets comes from that adapter and
each `TextDelta` is stamped with it by construction (`verifies_tokens`). A release without
weights is the base model (no `lora_path`). A failed or timed-out load is unloaded again and
raises; `unload` calls `/unload_lora_adapter`.

Supervision: a watchdog asks `/health` every second; after three failures in a row requests are
refused with 503 (`EngineUnavailable`, Retry-After) until SGLang answers again and every adapter
this runtime holds is loaded again under its same name. SGLang refusing a `lora_path` it should
hold (it restarted between two health checks) starts that reload too.
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping

import aiohttp

from reef.core.chat import ChatRequest, Delta, Finish, FinishReason, TextDelta, ToolCallDelta, Usage
from reef.core.errors import RuntimeFailure
from reef.core.types import ReleaseRef
from reef.runtimes.base import Runtime
from reef.runtimes.chatml import TextStream, prompt_ids, stop_token_ids
from reef.runtimes.engine_common import EngineUnavailable, adapter_files, error_message, load_adapter
from reef.runtimes.upstream_wire import SSEParser, UpstreamProblem, loads_json

if TYPE_CHECKING:
    from reef.config import ServeConfig

log = logging.getLogger("reef.sglang")
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "error"}
# SGLang fills sampling parameters a request leaves out from the model's generation_config.json
# (its default `--sampling-defaults model`); Reef's requests mean none of these, so they go neutral.
_NEUTRAL = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
_LOST_ADAPTER = "not loaded"  # in SGLang's refusal of a lora_path it does not hold
_FAILURES_BEFORE_DOWN = 3


class SGLangRuntime(Runtime):
    name = "sglang"
    verifies_tokens = True

    def __init__(self, url: str, *, adapter_dir: Path, model_dir: Path | None = None, model_name: str | None = None,
                 default_max_tokens: int = 256, timeout: float = 120.0, load_timeout: float = 120.0,
                 health_interval: float = 1.0) -> None:
        self.url = url.rstrip("/")
        # the base model's folder: the training process trains on it (reef/serve/learning.py); None: no weights learning
        self.model_dir = Path(model_dir) if model_dir else None
        self.engine_dtype: str | None = None  # not asked of SGLang: learner.dtype auto takes bf16 on a GPU
        self.model_name = model_name
        self.adapter_dir = adapter_dir
        self.default_max_tokens = default_max_tokens
        self.load_timeout = load_timeout
        self.health_interval = health_interval
        self.tokenizer: Any = None
        self._stop_ids: frozenset[int] = frozenset()
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
        self._incarnation = secrets.token_hex(4)
        self._counter = itertools.count(1)
        self._loads: dict[str, Path | None] = {}  # load name -> its PEFT folder (None: the base model)
        self._client: aiohttp.ClientSession | None = None
        self._down: str | None = "SGLang is not attached yet"
        self._watchdog: asyncio.Task[None] | None = None
        self._closing = False
        self.restarts = 0  # times SGLang came back and got its adapters again (tests, logs)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._client is not None:
            return
        self._client = aiohttp.ClientSession(timeout=self._timeout,
                                             connector=aiohttp.TCPConnector(limit=256, limit_per_host=256))
        self.adapter_dir.mkdir(parents=True, exist_ok=True)
        if not await self._healthy():
            raise RuntimeFailure(f"no SGLang answers /health at {self.url} (start it with --enable-lora)")
        info = await self._get_json("/get_model_info")
        self.model_name = self.model_name or str(info.get("model_path") or "sglang")
        source = self.model_dir or info.get("tokenizer_path") or info.get("model_path")
        self.tokenizer = await asyncio.to_thread(_tokenizer, str(source))
        self._stop_ids = stop_token_ids(self.tokenizer)
        self._down = None
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        log.info("attached to SGLang at %s serving %s", self.url, self.model_name)

    async def close(self) -> None:
        """Stop watching and unload what this runtime loaded: SGLang outlives Reef, and the
        adapters' folders are deleted here."""
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watchdog
            self._watchdog = None
        client, self._client = self._client, None
        if client is not None:
            if not self._down:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._unload_all(client), 10)
            await client.close()
        shutil.rmtree(self.adapter_dir, ignore_errors=True)

    async def _unload_all(self, client: aiohttp.ClientSession) -> None:
        for name in self.resident_adapters():
            async with client.post(f"{self.url}/unload_lora_adapter", json={"lora_name": name}) as response:
                await response.read()

    def served_models(self) -> list[str]:
        return [self.model_name] if self.model_name else []

    async def _healthy(self) -> bool:
        """SGLang's /health generates one token (it can take a second or more while busy)."""
        assert self._client is not None
        try:
            async with self._client.get(f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=25)) as response:
                return response.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def _get_json(self, path: str) -> Any:
        assert self._client is not None
        async with self._client.get(f"{self.url}{path}") as response:
            raw = await response.text()
        if response.status != 200:
            raise RuntimeFailure(f"SGLang {path} answered {response.status}: {error_message(raw)}")
        try:
            return loads_json(raw)
        except UpstreamProblem as exc:
            raise RuntimeFailure(f"SGLang {path} {exc}") from None

    async def _watch(self) -> None:
        """Mark SGLang down after three failed health checks; once it answers again, give it
        back every adapter (a restarted SGLang holds none)."""
        failures = 0
        while not self._closing:
            await asyncio.sleep(self.health_interval)
            if not await self._healthy():
                failures += 1
                if failures >= _FAILURES_BEFORE_DOWN and not self._down:
                    self._down = f"SGLang at {self.url} does not answer /health"
                    log.error("%s", self._down)
                continue
            failures = 0
            if self._down:
                await self._recover()

    async def _recover(self) -> None:
        """Load every adapter this runtime holds again under its same name (unloading it first:
        an SGLang that never went away may still hold it), then serve again."""
        try:
            for name, folder in list(self._loads.items()):
                if folder is not None and name in self._loads:
                    with contextlib.suppress(RuntimeFailure):
                        await self._post_adapter("unload", {"lora_name": name})
                    await self._post_adapter("load", {"lora_name": name, "lora_path": str(folder)})
        except RuntimeFailure as exc:  # tried again at the next health check
            log.error("reloading adapters into SGLang failed: %s", exc)
            return
        self.restarts += 1
        self._down = None
        log.warning("SGLang serving again at %s with %d adapter(s) reloaded", self.url, len(self.resident_adapters()))

    # -- releases ----------------------------------------------------------------------------

    async def load(self, content_id: str, files: Mapping[str, bytes]) -> str:
        """A release without weights serves the base model; one with a PEFT LoRA adapter gets it
        loaded into SGLang under a fresh name, which is also its runtime_load_id."""
        name = f"reef-{self._incarnation}-{next(self._counter)}"
        adapter = adapter_files(files)
        if adapter is None:
            self._loads[name] = None
            return name
        if self._down:
            raise EngineUnavailable(f"cannot load content {content_id}: {self._down}")
        folder = self.adapter_dir / name
        await load_adapter("SGLang", content_id, folder, adapter, timeout=self.load_timeout,
                           load=lambda: self._post_adapter("load", {"lora_name": name, "lora_path": str(folder)}),
                           unload=lambda: self._post_adapter("unload", {"lora_name": name}))
        self._loads[name] = folder
        return name

    async def unload(self, runtime_load_id: str) -> None:
        folder = self._loads.pop(runtime_load_id, None)
        if folder is None:
            return
        try:
            await self._post_adapter("unload", {"lora_name": runtime_load_id})
        except RuntimeFailure as exc:  # a restarted SGLang holds none, and this one is not reloaded
            log.warning("unloading %s from SGLang: %s", runtime_load_id, exc)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    async def _post_adapter(self, action: str, body: dict[str, str]) -> None:
        """SGLang answers an adapter update with `{success, error_message, loaded_adapters}`,
        400 when it failed."""
        assert self._client is not None
        try:
            async with self._client.post(f"{self.url}/{action}_lora_adapter", json=body) as response:
                text = await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise RuntimeFailure(f"SGLang {action}_lora_adapter failed: {type(exc).__name__} {exc}") from None
        if response.status != 200 or _says_failed(text):
            raise RuntimeFailure(f"SGLang {action}_lora_adapter answered {response.status}: {error_message(text)}")

    def resident_adapters(self) -> list[str]:
        """The adapters this runtime has loaded into SGLang (their load names), for /reef/status."""
        return sorted(name for name, folder in self._loads.items() if folder is not None)

    # -- generation ----------------------------------------------------------------------------

    def _lora_of(self, release: ReleaseRef) -> tuple[str, str | None]:
        """(runtime_load_id, the lora_path to send: None for the base model)."""
        load_id = release.runtime_load_id
        if load_id is None or load_id not in self._loads:
            raise RuntimeFailure(f"runtime load {load_id!r} of release {release.release_id} is not loaded here")
        return load_id, (load_id if self._loads[load_id] is not None else None)

    def _body(self, request: ChatRequest, prompt: list[int], lora: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": request.max_tokens or self.default_max_tokens,
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "top_p": 1.0 if request.top_p is None else request.top_p,
            "stop_token_ids": sorted(self._stop_ids), **_NEUTRAL,
        }
        if request.stop:
            params["stop"] = list(request.stop)
        if request.seed is not None:  # honoured by SGLang started with --enable-deterministic-inference
            params["sampling_seed"] = request.seed % 2**63
        body: dict[str, Any] = {"input_ids": prompt, "sampling_params": params, "return_logprob": True, "stream": True}
        if lora is not None:
            body["lora_path"] = lora
        return body

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode([t for t in ids if t not in self._stop_ids], skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False))

    async def _unavailable(self, what: str) -> RuntimeFailure:
        """A 503 when SGLang is down (asked /health when the watchdog has not said so yet),
        else a 502 saying `what`."""
        if self._down:
            return EngineUnavailable(f"SGLang is not serving ({self._down}); retry shortly")
        if not await self._healthy():
            return EngineUnavailable(f"SGLang at {self.url} does not answer /health; retry shortly")
        return RuntimeFailure(f"SGLang at {self.url} {what}")

    async def _refused(self, status: int, raw: str, lora: str | None) -> RuntimeFailure:
        """SGLang's refusal of a request: its 4xx (and the error event that opens a refused
        stream) is the client's problem, relayed as 400, unless it is the adapter this runtime
        loaded, which means SGLang restarted: then a 503 while the watchdog reloads it."""
        message = error_message(raw)
        if lora is not None and _LOST_ADAPTER in message and lora in self._loads and not self._down:
            self._down = f"SGLang lost adapter {lora} (restarted?); reloading"
            log.error("%s", self._down)
            return EngineUnavailable(f"SGLang is not serving ({self._down}); retry shortly")
        if 400 <= status < 500:
            return RuntimeFailure(f"SGLang refused the request ({status}): {message}", status=400,
                                  error_type="invalid_request_error")
        return await self._unavailable(f"failed ({status}): {message}")

    async def generate(self, request: ChatRequest, release: ReleaseRef) -> AsyncIterator[Delta]:
        if self._client is None or self.tokenizer is None:
            raise RuntimeFailure("the SGLang runtime is not started")
        if self._down:
            raise EngineUnavailable(f"SGLang is not serving ({self._down}); retry shortly")
        load_id, lora = self._lora_of(release)
        prompt = prompt_ids(self.tokenizer, request)
        stream = TextStream(self._decode, request.stop, bool(request.tools) and request.tool_choice != "none")
        ids: list[int] = []
        usage = Usage(len(prompt), 0)
        reason: FinishReason | None = None
        try:
            async with self._client.post(f"{self.url}/generate", json=self._body(request, prompt, lora)) as response:
                if response.status != 200:
                    raise await self._refused(response.status, await response.text(), lora)
                events = SSEParser()
                async for piece in response.content.iter_any():
                    for _event, data in events.feed(piece):
                        if data.strip() == "[DONE]":
                            continue
                        chunk = loads_json(data)
                        if chunk.get("error"):
                            raise await self._refused(400, data, lora)
                        meta = chunk.get("meta_info") or {}
                        tokens, logprobs = new_tokens(meta, len(ids))
                        if tokens:
                            ids.extend(tokens)
                            yield TextDelta(stream.push(ids), tuple(tokens), tuple(logprobs), load_id)
                        if meta.get("finish_reason"):
                            reason = _finish_reason(meta["finish_reason"])
                            usage = Usage(int(meta.get("prompt_tokens") or len(prompt)),
                                          int(meta.get("completion_tokens") or len(ids)))
        except RuntimeFailure:
            raise
        except UpstreamProblem as exc:
            raise RuntimeFailure(f"SGLang {exc}") from None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
            raise await self._unavailable(f"broke the answer off ({type(exc).__name__})") from None
        if reason is None:
            raise await self._unavailable("ended the stream before the answer finished")
        rest, calls = stream.finish(ids)
        if rest:
            yield TextDelta(rest, (), (), load_id)
        for index, call in enumerate(calls):
            yield ToolCallDelta(call, index)
        yield Finish("tool_calls" if calls else reason, usage, model=self.model_name, prompt_token_ids=tuple(prompt))

    async def count_tokens(self, request: ChatRequest) -> int:
        if self.tokenizer is None:
            raise RuntimeFailure("the SGLang runtime is not started")
        return len(prompt_ids(self.tokenizer, request))


def new_tokens(meta: Mapping[str, Any], have: int) -> tuple[list[int], list[float]]:
    """The tokens (ids, log-probs) one `/generate` stream chunk adds to the `have` already read.
    `meta_info.output_token_logprobs` holds `[logprob, token_id, text]` per token: every token so
    far by default, only the chunk's own under `--incremental-streaming-output`;
    `completion_tokens`, always the running total, tells which."""
    entries = list(meta.get("output_token_logprobs") or ())
    total = int(meta.get("completion_tokens", have + len(entries)))
    if len(entries) == total:
        entries = entries[have:]
    elif have + len(entries) != total:
        raise UpstreamProblem(f"sent {len(entries)} token log-probs for {total} tokens after {have}")
    return [int(e[1]) for e in entries], [float(e[0]) for e in entries]


def _finish_reason(finish: Any) -> FinishReason:
    """SGLang's `meta_info.finish_reason`: `{"type": "stop" | "length" | "abort", ...}`."""
    kind = finish.get("type") if isinstance(finish, dict) else finish
    return _FINISH.get(str(kind), "stop")


def _says_failed(text: str) -> bool:
    try:
        body = json.loads(text)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("success") is False


def _tokenizer(source: str) -> Any:
    """The model's tokenizer (a folder, or a hub id in the local cache), with its chat template."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise RuntimeFailure(f"cannot load the tokenizer of {source} ({exc}); set sglang.model_dir to the model's "
                             "folder on this machine") from None


def build_sglang_runtime(config: ServeConfig) -> SGLangRuntime:
    """The runtime `runtime: sglang` asks for: attached to `sglang.url`, adapters written under
    `sglang.adapter_dir` (default `<cache>/sglang-adapters`), which SGLang must be able to read."""
    from reef.extras import require
    from reef.runtimes.model_files import default_cache_dir

    s = config.sglang
    if not s.url:
        raise ValueError("runtime 'sglang' needs sglang.url (or REEF_SGLANG__URL): Reef attaches to a running "
                         "SGLang server started with --enable-lora (docs/engines.md)")
    require("the SGLang runtime (runtime: sglang) tokenizes Reef's ChatML prompts with", "embedded")
    root = s.adapter_dir or (config.embedded.cache_dir or default_cache_dir()) / "sglang-adapters"
    return SGLangRuntime(s.url, adapter_dir=root / f"{os.getpid()}-{secrets.token_hex(3)}",
                         model_dir=s.model_dir or config.embedded.model_dir, model_name=s.model_name,
                         default_max_tokens=s.default_max_tokens, timeout=s.timeout, load_timeout=s.load_timeout)
