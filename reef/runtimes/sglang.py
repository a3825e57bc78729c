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
raises; `unload` calls `/unload_lora_adapter`. A full-weight release is pushed with
`/update_weights_from_disk` instead (`_push_weights`, engine_weights.py): one at a time, between
requests; `sglang.model_dir` must name the base model's folder for a rollback to the base.

Supervision: a watchdog asks `/health` every second; after three failures in a row requests are
refused with 503 (`EngineUnavailable`, Retry-After) until SGLang answers again and every adapter
this runtime holds is loaded again under its same name. SGLang refusing a `lora_path` it should
hold (it restarted between two health checks) starts that reload too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import aiohttp

from reef.core.chat import ChatRequest, Delta, FinishReason, TextDelta, Usage
from reef.core.errors import RuntimeFailure
from reef.core.types import ReleaseRef
from reef.runtimes.chatml import TextStream, prompt_ids, stop_token_ids
from reef.runtimes.engine_base import EngineAnswer, EngineRuntime
from reef.runtimes.engine_common import EngineUnavailable, error_message
from reef.runtimes.upstream_wire import UpstreamProblem, loads_json

if TYPE_CHECKING:
    from reef.config import ServeConfig

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "error"}
# SGLang fills sampling parameters a request leaves out from the model's generation_config.json
# (its default `--sampling-defaults model`); Reef's requests mean none of these, so they go neutral.
_NEUTRAL = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}
_LOST_ADAPTER = "not loaded"  # in SGLang's refusal of a lora_path it does not hold


class _GenerateAnswer(EngineAnswer):
    """A streamed `/generate`: each chunk's `meta_info` carries the tokens generated (ids and
    log-probs), decoded here; the last one its finish reason and token counts."""

    def __init__(self, load_id: str, lora: str | None, prompt: list[int], stream: TextStream) -> None:
        super().__init__(load_id, stream, tuple(prompt))
        self.lora = lora  # the lora_path to send: None for the base model

    def read(self, chunk: dict[str, Any]) -> Iterator[Delta]:
        meta = chunk.get("meta_info") or {}
        tokens, logprobs = new_tokens(meta, len(self.ids))
        if tokens:
            self.ids.extend(tokens)
            yield TextDelta(self.stream.push(self.ids), tuple(tokens), tuple(logprobs), self.load_id)
        if meta.get("finish_reason"):
            self.reason = _finish_reason(meta["finish_reason"])
            self.usage = Usage(
                int(meta.get("prompt_tokens") or len(self.prompt_ids)),
                int(meta.get("completion_tokens") or len(self.ids)),
            )


class SGLangRuntime(EngineRuntime[_GenerateAnswer]):
    name = "sglang"
    engine = "SGLang"
    log = logging.getLogger("reef.sglang")
    generate_route = "/generate"
    health_timeout = 25.0  # SGLang's /health generates one token (it can take a second or more while busy)

    def __init__(
        self,
        url: str,
        *,
        adapter_dir: Path,
        model_dir: Path | None = None,
        model_name: str | None = None,
        default_max_tokens: int = 256,
        timeout: float = 120.0,
        load_timeout: float = 120.0,
        health_interval: float = 1.0,
    ) -> None:
        # engine_dtype is not asked of SGLang: learner.dtype auto takes bf16 on a GPU
        super().__init__(
            url=url.rstrip("/"),
            adapter_dir=adapter_dir,
            model_name=model_name,
            model_dir=Path(model_dir) if model_dir else None,
            engine_dtype=None,
            default_max_tokens=default_max_tokens,
            timeout=timeout,
            load_timeout=load_timeout,
            health_interval=health_interval,
            down="SGLang is not attached yet",
        )
        self.tokenizer: Any = None
        self._stop_ids: frozenset[int] = frozenset()

    # -- lifecycle ---------------------------------------------------------------------------

    async def _attach(self) -> None:
        if not await self._healthy():
            raise RuntimeFailure(f"no SGLang answers /health at {self.url} (start it with --enable-lora)")
        info = await self._get_json("/get_model_info")
        self.model_name = self.model_name or str(info.get("model_path") or "sglang")
        source = self.model_dir or info.get("tokenizer_path") or info.get("model_path")
        self.tokenizer = await asyncio.to_thread(_tokenizer, str(source))
        self._stop_ids = stop_token_ids(self.tokenizer)
        self.log.info("attached to SGLang at %s serving %s", self.url, self.model_name)

    async def _let_go(self) -> None:
        """Unload what this runtime loaded: SGLang outlives Reef (the adapters' folders are deleted
        by `close`)."""
        if self._client is not None and not self._down:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._unload_all(self._client), 10)

    async def _unload_all(self, client: aiohttp.ClientSession) -> None:
        for name in self.resident_adapters():
            async with client.post(f"{self.url}/unload_lora_adapter", json={"lora_name": name}) as response:
                await response.read()

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

    # -- releases ----------------------------------------------------------------------------

    def _says_failed(self, text: str) -> bool:
        """SGLang answers an adapter update with `{success, error_message, loaded_adapters}`,
        400 when it failed (and `success: false` tells it all the same)."""
        try:
            body = json.loads(text)
        except ValueError:
            return False
        return isinstance(body, dict) and body.get("success") is False

    async def _push_weights(self, folder: Path) -> None:
        """SGLang's `/update_weights_from_disk` (its cache flushed), between `/pause_generation`
        (retract: what runs goes back to the queue, recomputed on the new weights) and
        `/continue_generation`, which always follows."""
        await self.post_json("/pause_generation", {"mode": "retract"})
        try:
            await self.post_json(
                "/update_weights_from_disk",
                {"model_path": str(folder), "weight_version": folder.name, "flush_cache": True},
            )
        finally:
            await self.post_json("/continue_generation", {})

    # -- generation ----------------------------------------------------------------------------

    def _started(self) -> bool:
        return self._client is not None and self.tokenizer is not None

    def _answer(self, request: ChatRequest, release: ReleaseRef) -> _GenerateAnswer:
        load_id = release.runtime_load_id
        if load_id is None or load_id not in self._loads:
            raise RuntimeFailure(f"runtime load {load_id!r} of release {release.release_id} is not loaded here")
        lora = load_id if self._loads[load_id] is not None else None
        stream = TextStream(self._decode, request.stop, bool(request.tools) and request.tool_choice != "none")
        return _GenerateAnswer(load_id, lora, prompt_ids(self.tokenizer, request), stream)

    def _body(self, request: ChatRequest, answer: _GenerateAnswer) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": request.max_tokens or self.default_max_tokens,
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "top_p": 1.0 if request.top_p is None else request.top_p,
            "stop_token_ids": sorted(self._stop_ids),
            **_NEUTRAL,
        }
        if request.stop:
            params["stop"] = list(request.stop)
        if request.seed is not None:  # honoured by SGLang started with --enable-deterministic-inference
            params["sampling_seed"] = request.seed % 2**63
        body: dict[str, Any] = {
            "input_ids": list(answer.prompt_ids),
            "sampling_params": params,
            "return_logprob": True,
            "stream": True,
        }
        if answer.lora is not None:
            body["lora_path"] = answer.lora
        return body

    def _decode(self, ids: list[int]) -> str:
        return str(
            self.tokenizer.decode(
                [t for t in ids if t not in self._stop_ids],
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
        )

    async def _refused(self, status: int, raw: str, answer: _GenerateAnswer) -> RuntimeFailure:
        """SGLang's refusal of a request: its 4xx (and the error event that opens a refused
        stream) is the client's problem, relayed as 400, unless it is the adapter this runtime
        loaded, which means SGLang restarted: then a 503 while the watchdog reloads it."""
        message = error_message(raw)
        lora = answer.lora
        if lora is not None and _LOST_ADAPTER in message and lora in self._loads and not self._down:
            self._down = f"SGLang lost adapter {lora} (restarted?); reloading"
            self.log.error("%s", self._down)
            return EngineUnavailable(f"SGLang is not serving ({self._down}); retry shortly")
        if 400 <= status < 500:
            return RuntimeFailure(
                f"SGLang refused the request ({status}): {message}", status=400, error_type="invalid_request_error"
            )
        return await self._unavailable(f"failed ({status}): {message}")

    async def _stream_error(self, data: str, chunk: dict[str, Any], answer: _GenerateAnswer) -> RuntimeFailure:
        return await self._refused(400, data, answer)

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


def _tokenizer(source: str) -> Any:
    """The model's tokenizer (a folder, or a hub id in the local cache), with its chat template."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise RuntimeFailure(
            f"cannot load the tokenizer of {source} ({exc}); set sglang.model_dir to the model's folder on this machine"
        ) from None


def build_sglang_runtime(config: ServeConfig) -> SGLangRuntime:
    """The runtime `runtime: sglang` asks for: attached to `sglang.url`, adapters written under
    `sglang.adapter_dir` (default `<cache>/sglang-adapters`), which SGLang must be able to read."""
    from reef.extras import require
    from reef.runtimes.model_files import default_cache_dir

    s = config.sglang
    if not s.url:
        raise ValueError(
            "runtime 'sglang' needs sglang.url (or REEF_SGLANG__URL): Reef attaches to a running "
            "SGLang server started with --enable-lora (docs/engines.md)"
        )
    require("the SGLang runtime (runtime: sglang) tokenizes Reef's ChatML prompts with", "embedded")
    root = s.adapter_dir or (config.embedded.cache_dir or default_cache_dir()) / "sglang-adapters"
    return SGLangRuntime(
        s.url,
        adapter_dir=root / f"{os.getpid()}-{secrets.token_hex(3)}",
        model_dir=s.model_dir or config.embedded.model_dir,
        model_name=s.model_name,
        default_max_tokens=s.default_max_tokens,
        timeout=s.timeout,
        load_timeout=s.load_timeout,
    )
