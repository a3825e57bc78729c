"""The runtime of an inference engine Reef talks to over HTTP (vLLM, SGLang): what both do alike.

An engine runtime holds one aiohttp session to its engine; loads each release's LoRA adapter into
it under a fresh name (`reef-<incarnation>-<n>`, the release's `runtime_load_id`; a release
without weights is the base model); gives an engine that came back every adapter again under the
same name; refuses requests with 503 (`EngineUnavailable`) while the engine is down; and turns
the engine's streamed answer into deltas (the stream's errors, its end, the tool calls, the
`Finish`). What differs stays in `vllm.py` and `sglang.py`: how the engine is started or attached
(`_attach`), its routes and request bodies (`_answer`, `_body`), how one chunk of its stream reads
(`EngineAnswer.read`), how it refuses a request (`_refused`, `_stream_error`) and how it takes new
weights (`_push_weights`).

A full-weight release is pushed into the engine instead (`engine_weights.py`): the engine holds one
set of weights at a time, the base's or one full-weight release's, swapped between requests; a
release without weights loaded while the engine holds full weights pushes the base back first (a
rollback to the base is served), and an engine that came back is given the resident weights again
before its adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, AsyncIterator, Generic, Iterator, Mapping, TypeVar

import aiohttp

from reef.core.chat import ChatRequest, Delta, Finish, FinishReason, TextDelta, ToolCallDelta, Usage
from reef.core.errors import RuntimeFailure
from reef.core.training import weights_kind
from reef.core.types import ReleaseRef
from reef.runtimes.base import Runtime
from reef.runtimes.chatml import TextStream
from reef.runtimes.engine_common import EngineUnavailable, adapter_files, error_message, load_adapter
from reef.runtimes.engine_weights import ResidentWeights
from reef.runtimes.full_weights import write_full_weights
from reef.runtimes.upstream_wire import SSEParser, UpstreamProblem, loads_json

FAILURES_BEFORE_DOWN = 3  # health checks failed in a row before an attached engine counts as down


class EngineAnswer(ABC):
    """One answer as its engine streams it: the tokens so far, the text released from them, the
    prompt's token ids, the usage and how it ended. A subclass reads its engine's chunks."""

    def __init__(self, load_id: str, stream: TextStream, prompt_ids: tuple[int, ...] = ()) -> None:
        self.load_id = load_id
        self.stream = stream
        self.ids: list[int] = []
        self.prompt_ids = prompt_ids
        self.usage = Usage(len(prompt_ids), 0)
        self.reason: FinishReason | None = None

    @abstractmethod
    def read(self, chunk: dict[str, Any]) -> Iterator[Delta]:
        """Take in one chunk of the stream (not an error): the deltas it releases."""

    def final_usage(self) -> Usage:
        return self.usage


AnswerT = TypeVar("AnswerT", bound=EngineAnswer)


class EngineRuntime(Runtime, Generic[AnswerT]):
    verifies_tokens = True
    engine = "the engine"  # its name in messages
    log = logging.getLogger("reef.engine")
    api_prefix = ""  # before `/load_lora_adapter` and `/unload_lora_adapter`
    generate_route = ""
    health_timeout = 10.0

    def __init__(
        self,
        *,
        url: str | None,
        adapter_dir: Path,
        model_name: str | None,
        model_dir: Path | None,
        engine_dtype: str | None,
        default_max_tokens: int,
        timeout: float,
        load_timeout: float,
        health_interval: float,
        down: str,
    ) -> None:
        self._url = url
        self.model_name = model_name
        # the base model's folder: the training process trains on it (reef/serve/learning.py); None: no weights learning
        self.model_dir = model_dir
        self.engine_dtype = engine_dtype  # the trainer matches it on a GPU (learner.dtype: auto)
        self.adapter_dir = adapter_dir
        self.default_max_tokens = default_max_tokens
        self.load_timeout = load_timeout
        self.health_interval = health_interval
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
        self._incarnation = secrets.token_hex(4)
        self._counter = itertools.count(1)
        self._loads: dict[str, Path | None] = {}  # load name -> its PEFT folder (None: the base model)
        self._full: dict[str, Path] = {}  # load name -> its full-weight release's folder
        self.weights = ResidentWeights()
        self._client: aiohttp.ClientSession | None = None
        self._down: str | None = down
        self._watchdog: asyncio.Task[None] | None = None
        self._closing = False
        self.restarts = 0  # times the engine came back and got its adapters again (tests, /reef/status)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return str(self._url)

    async def start(self) -> None:
        if self._client is not None:
            return
        self._client = aiohttp.ClientSession(
            timeout=self._timeout, connector=aiohttp.TCPConnector(limit=256, limit_per_host=256)
        )
        self.adapter_dir.mkdir(parents=True, exist_ok=True)
        await self._attach()
        self._down = None
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    @abstractmethod
    async def _attach(self) -> None:
        """Start the engine or find it answering, and learn what it serves."""

    async def close(self) -> None:
        self._closing = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watchdog
            self._watchdog = None
        await self._let_go()
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        shutil.rmtree(self.adapter_dir, ignore_errors=True)

    async def _let_go(self) -> None:
        """What closing does to the engine itself, the session still open."""

    def served_models(self) -> list[str]:
        return [self.model_name] if self.model_name else []

    async def _healthy(self) -> bool:
        assert self._client is not None
        try:
            async with self._client.get(
                f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=self.health_timeout)
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def _watch(self) -> None:
        """Mark the engine down after three failed health checks in a row; once it answers again,
        give it back every adapter (a restarted engine holds none)."""
        failures = 0
        while not self._closing:
            await asyncio.sleep(self.health_interval)
            if not await self._healthy():
                failures += 1
                if failures >= FAILURES_BEFORE_DOWN and not self._down:
                    self._down = f"{self.engine} at {self.url} does not answer /health"
                    self.log.error("%s", self._down)
                continue
            failures = 0
            if self._down:
                await self._recover()

    async def _recover(self) -> None:
        try:
            await self._restore()
        except Exception as exc:  # tried again at the next health check
            self.log.error("reloading adapters into %s failed: %s", self.engine, exc)
            return
        self._serving_again()

    async def _restore(self) -> None:
        """An engine that came back (restarted on its base weights): the resident full weights
        pushed again, then every adapter."""
        if self.weights.folder is not None:
            await asyncio.wait_for(self._push_weights(self.weights.folder), self.load_timeout)
        await self._reload_adapters()

    async def _reload_adapters(self) -> None:
        """Load every adapter this runtime holds again under its same name (unloading it first:
        an engine that never went away may still hold it)."""
        for name, folder in list(self._loads.items()):
            if folder is not None and name in self._loads:
                with contextlib.suppress(RuntimeFailure):
                    await self._post_adapter("unload", {"lora_name": name})
                await self._post_adapter("load", {"lora_name": name, "lora_path": str(folder)})

    def _serving_again(self) -> None:
        self.restarts += 1
        self._down = None
        self.log.warning(
            "%s serving again at %s with %d adapter(s) reloaded", self.engine, self.url, len(self.resident_adapters())
        )

    # -- releases ----------------------------------------------------------------------------

    async def load(self, content_id: str, files: Mapping[str, bytes]) -> str:
        """A release without weights serves the base model; one with a PEFT LoRA adapter gets it
        loaded into the engine under a fresh name, which is also its runtime_load_id."""
        name = f"reef-{self._incarnation}-{next(self._counter)}"
        if weights_kind(files) == "full":
            return await self._load_full(name, content_id, files)
        if self.weights.folder is not None:  # the engine holds full weights: the base goes back first
            await self._swap(None, name, content_id)
        adapter = adapter_files(files)
        if adapter is None:
            self._loads[name] = None
            return name
        if self._down:
            raise EngineUnavailable(f"cannot load content {content_id}: {self._down}")
        folder = self.adapter_dir / name
        await load_adapter(
            self.engine,
            content_id,
            folder,
            adapter,
            timeout=self.load_timeout,
            load=lambda: self._post_adapter("load", {"lora_name": name, "lora_path": str(folder)}),
            unload=lambda: self._post_adapter("unload", {"lora_name": name}),
        )
        self._loads[name] = folder
        return name

    async def _load_full(self, name: str, content_id: str, files: Mapping[str, bytes]) -> str:
        if self._down:
            raise EngineUnavailable(f"cannot load content {content_id}: {self._down}")
        folder = await asyncio.to_thread(write_full_weights, files, self.adapter_dir / name)
        try:
            await self._swap(folder, name, content_id)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._loads[name] = None
        self._full[name] = folder
        return name

    async def _swap(self, folder: Path | None, name: str, content_id: str) -> None:
        """Push `folder` (None: the base model's folder) into the engine (engine_weights.py), then
        give it its adapters again (a reload drops them)."""
        previous = self.weights.folder

        async def push() -> None:
            await self._push_weights(self._folder_of(folder))
            if self.resident_adapters():
                await self._reload_adapters()

        async def restore(back: Path | None) -> None:
            await self._push_weights(self._folder_of(back))

        try:
            await self.weights.swap(folder, name, push, restore, self.load_timeout)
        except RuntimeFailure as exc:
            raise RuntimeFailure(f"{self.engine} could not load content {content_id} as its weights: {exc}") from None
        except Exception as exc:
            raise RuntimeFailure(f"{self.engine} could not load content {content_id} as its weights: {exc!r}") from None
        if previous is not None and previous not in self._full.values():  # its load went meanwhile
            shutil.rmtree(previous, ignore_errors=True)

    def _weights_of(self, load_id: str) -> Path | None | str:
        """The weights a load is served on: its full-weight folder, None (the base) for a load
        without weights, "adapter" for a LoRA adapter (rides on the base, never restamped)."""
        if self._loads.get(load_id) is not None:
            return "adapter"
        return self._full.get(load_id)

    def _stamp(self, resident: str) -> str:
        """The load to stamp an answer with that the resident weights serve: the full-weight
        release's load, or, on the base, a load of the base (any: they are the same weights)."""
        if self.weights.folder is not None:
            return resident
        return next((n for n, f in self._loads.items() if f is None and n not in self._full), resident)

    def _folder_of(self, folder: Path | None) -> Path:
        if folder is not None:
            return folder
        if self.model_dir is None:
            raise RuntimeFailure(f"the base model's folder is unknown here: set the {self.engine} model_dir")
        return self.model_dir

    async def _push_weights(self, folder: Path) -> None:
        """Have the engine reload its weights from `folder` and drop its prefix cache."""
        raise RuntimeFailure(f"{self.engine} takes no full-weight releases here")

    async def post_json(self, path: str, body: dict[str, Any] | None = None, **params: str) -> Any:
        """POST to the engine; its JSON answer (None if empty), or RuntimeFailure saying what it
        answered (an error status, or SGLang's `success: false`)."""
        assert self._client is not None
        try:
            async with self._client.post(f"{self.url}{path}", json=body, params=params or None) as response:
                text = await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise RuntimeFailure(f"{self.engine} {path} failed: {type(exc).__name__} {exc}") from None
        if response.status != 200 or self._says_failed(text):
            raise RuntimeFailure(f"{self.engine} {path} answered {response.status}: {error_message(text)}")
        return loads_json(text) if text.strip() else None

    async def unload(self, runtime_load_id: str) -> None:
        full = self._full.pop(runtime_load_id, None)
        if full is not None and full != self.weights.folder:  # the resident folder stays: a restart reloads it
            shutil.rmtree(full, ignore_errors=True)
        folder = self._loads.pop(runtime_load_id, None)
        if folder is None:
            return
        try:
            await self._post_adapter("unload", {"lora_name": runtime_load_id})
        except RuntimeFailure as exc:  # a restarted engine holds none, and this one is not reloaded
            self.log.warning("unloading %s from %s: %s", runtime_load_id, self.engine, exc)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    async def _post_adapter(self, action: str, body: dict[str, str]) -> None:
        assert self._client is not None
        try:
            async with self._client.post(f"{self.url}{self.api_prefix}/{action}_lora_adapter", json=body) as response:
                text = await response.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise RuntimeFailure(f"{self.engine} {action}_lora_adapter failed: {type(exc).__name__} {exc}") from None
        if response.status != 200 or self._says_failed(text):
            raise RuntimeFailure(
                f"{self.engine} {action}_lora_adapter answered {response.status}: {error_message(text)}"
            )

    def _says_failed(self, text: str) -> bool:
        """Whether an adapter update the engine answered with 200 failed all the same."""
        return False

    def resident_adapters(self) -> list[str]:
        """The adapters this runtime has loaded into the engine (their load names), for /reef/status."""
        return sorted(name for name, folder in self._loads.items() if folder is not None)

    # -- generation ----------------------------------------------------------------------------

    def _started(self) -> bool:
        return self._client is not None

    @abstractmethod
    def _answer(self, request: ChatRequest, release: ReleaseRef) -> AnswerT:
        """The answer about to be asked for (RuntimeFailure when the release is not loaded here)."""

    @abstractmethod
    def _body(self, request: ChatRequest, answer: AnswerT) -> dict[str, Any]:
        """The JSON body posted to `generate_route`."""

    @abstractmethod
    async def _refused(self, status: int, raw: str, answer: AnswerT) -> RuntimeFailure:
        """The failure to raise for an answer other than 200 (its body `raw`)."""

    @abstractmethod
    async def _stream_error(self, data: str, chunk: dict[str, Any], answer: AnswerT) -> RuntimeFailure:
        """The failure to raise for an error the stream reports (`data`, read as `chunk`)."""

    async def _unavailable(self, what: str) -> RuntimeFailure:
        """A 503 when the engine is down (asked /health when the watchdog has not said so yet),
        else a 502 saying `what`."""
        if self._down:
            return EngineUnavailable(f"{self.engine} is not serving ({self._down}); retry shortly")
        if not await self._healthy():
            return EngineUnavailable(f"{self.engine} at {self.url} does not answer /health; retry shortly")
        return RuntimeFailure(f"{self.engine} at {self.url} {what}")

    async def generate(self, request: ChatRequest, release: ReleaseRef) -> AsyncIterator[Delta]:
        if not self._started():
            raise RuntimeFailure(f"the {self.engine} runtime is not started")
        if self._down:
            raise EngineUnavailable(f"{self.engine} is not serving ({self._down}); retry shortly")
        async with self.weights.serving() as resident:
            answer = self._answer(request, release)
            weights = self._weights_of(answer.load_id)
            if resident is not None and weights != "adapter" and weights != self.weights.folder:
                answer.load_id = self._stamp(resident)  # served by the weights the engine holds
            async for delta in self._stream(request, answer):
                yield delta

    async def _stream(self, request: ChatRequest, answer: AnswerT) -> AsyncIterator[Delta]:
        assert self._client is not None
        try:
            async with self._client.post(
                f"{self.url}{self.generate_route}", json=self._body(request, answer)
            ) as response:
                if response.status != 200:
                    raise await self._refused(response.status, await response.text(), answer)
                events = SSEParser()
                async for piece in response.content.iter_any():
                    for _event, data in events.feed(piece):
                        if data.strip() == "[DONE]":
                            continue
                        chunk = loads_json(data)
                        if chunk.get("error"):
                            raise await self._stream_error(data, chunk, answer)
                        for delta in answer.read(chunk):
                            yield delta
        except RuntimeFailure:
            raise
        except UpstreamProblem as exc:
            raise RuntimeFailure(f"{self.engine} {exc}") from None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
            raise await self._unavailable(f"broke the answer off ({type(exc).__name__})") from None
        if answer.reason is None:
            raise await self._unavailable("ended the stream before the answer finished")
        rest, calls = answer.stream.finish(answer.ids)
        if rest:
            yield TextDelta(rest, (), (), answer.load_id)
        for index, call in enumerate(calls):
            yield ToolCallDelta(call, index)
        yield Finish(
            "tool_calls" if calls else answer.reason,
            answer.final_usage(),
            model=self.model_name,
            prompt_token_ids=answer.prompt_ids,
        )
