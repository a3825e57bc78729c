"""The embedded runtime: SmolLM2 (or the tiny test model) on the CPU through transformers + peft.

One worker thread owns the model (torch releases the GIL inside its kernels, so the event loop
stays responsive). It decodes queued requests in batches of one load id (left padding, position
ids `cumsum(mask) - 1`, a KV cache), and loads with work take turns, a batch each; with continuous
batching (off by default: docs/PERFORMANCE.md) a request joins its load's running batch between
two steps and loads take turns of a few steps. A prompt prefilled alone reuses the keys and values
of the start it shares with the load's last prompt prefilled alone. It samples each
row with the request's own temperature, top_p and seed, and streams every token back with its id
and the log-prob of the distribution it was actually drawn from, so records can be verified and
trained on (invariant 2, docs/architecture.md). Adapter loads and unloads also run on the worker,
between decoding steps, so no lock guards the model and a batch in flight never sees an adapter
vanish under it. A full-weight release is a model of its own (`full_weights.py`), read beside
the serving one while requests go on: a batch decodes on its load's model from start to end, so
requests in flight finish on the weights they started with, and the prefix kept for reuse is
kept per load, so no keys or values of older weights serve a newer release.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import tempfile
import threading
import time
import warnings
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator, Mapping

import torch

from reef.core.chat import ChatRequest, Delta, Finish, FinishReason, TextDelta, ToolCallDelta, Usage
from reef.core.errors import RuntimeFailure
from reef.core.prefix import MIN_SHARED_PREFIX, shared_prefix_length
from reef.core.training import adapter_part, weights_kind
from reef.core.types import ReleaseRef
from reef.runtimes.base import Runtime
from reef.runtimes.chatml import MAX_CONTEXT, TextStream, prompt_ids, stop_token_ids
from reef.runtimes.embedded_batch import Batch, FullModel, Job, Prefix
from reef.runtimes.full_weights import load_full_model
from reef.runtimes.sampling import sample

_UNSET = object()  # "adapter state unknown": forces the next batch step to set it again
# Many resident adapters is the point here, not the mistake peft warns about.
warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute", category=UserWarning)
warnings.filterwarnings("ignore", message=r"Adapter \S+ was active which is now deleted", category=UserWarning)


class EmbeddedRuntime(Runtime):
    name = "embedded"
    verifies_tokens = True

    def __init__(
        self,
        model_dir: Path,
        *,
        model_name: str = "smollm2-135m-instruct",
        threads: int | None = None,
        max_batch: int = 8,
        default_max_tokens: int = 256,
        max_context: int = MAX_CONTEXT,
        min_shared_prefix: int = MIN_SHARED_PREFIX,
        continuous: bool = False,
        turn_steps: int = 16,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.model_name = model_name
        self.threads = threads
        self.max_batch = max_batch
        self.default_max_tokens = default_max_tokens
        self.max_context = max_context
        self.min_shared_prefix = min_shared_prefix  # 0: every row prefills its whole prompt
        self.continuous = continuous  # requests join a running batch of their load between steps
        self.turn_steps = turn_steps  # decoding steps a load's batch runs while another load waits
        self.model: Any = None
        self.tokenizer: Any = None
        self.batches_run = 0  # counters for tests and /metrics
        self.requests_run = 0
        self.tokens_generated = 0
        self.shared_prefix_tokens = 0  # prompt tokens not prefilled again thanks to a batch's shared prefix
        self.reused_prefix_tokens = 0  # prompt tokens not prefilled again thanks to a load's last prefix
        # called on the worker thread as each batch starts: (requests, seconds each waited queued)
        self.batch_observer: Callable[[int, list[float]], None] | None = None
        self._incarnation = secrets.token_hex(4)
        self._counter = itertools.count(1)
        # runtime_load_id -> adapter name, the model of a full-weight release, or None (the base model)
        self._loads: dict[str, str | FullModel | None] = {}
        self._cond = threading.Condition()
        self._queue: list[Job] = []
        self._last_load_id: str | None = None  # of the turn before, for taking turns
        self._batches: dict[str, Batch] = {}  # by load id: running, or parked between turns
        self._prefixes: dict[str, Prefix] = {}  # by load id: the last prompt start prefilled alone
        self._calls: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._paused = 0
        self._closing = False
        self._worker: threading.Thread | None = None
        self._stop_ids: frozenset[int] = frozenset()
        self._adapters: set[str] = set()
        self._active: object = _UNSET
        self._doomed: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._worker is not None:
            return
        await asyncio.to_thread(self._load_weights)
        self._worker = threading.Thread(target=self._work, name="reef-embedded", daemon=True)
        self._worker.start()

    def _load_weights(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a server's log is no place for tqdm bars
        if self.threads:
            torch.set_num_threads(self.threads)  # process-wide: torch has one intra-op pool
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        self._stop_ids = stop_token_ids(self.tokenizer)

    async def close(self) -> None:
        worker = self._worker
        if worker is None:
            return
        with self._cond:
            self._closing = True
            for job in (job for batch in self._batches.values() for job in batch.jobs):
                # in flight: tell the consumer, and drop the row next step
                job.send(RuntimeFailure("the embedded runtime closed"))
                job.cancelled.set()
            self._cond.notify_all()
        await asyncio.to_thread(worker.join)
        self._worker = None
        for job in self._queue:
            job.send(RuntimeFailure("the embedded runtime closed"))
        self._queue.clear()
        for _, future in self._calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeFailure("the embedded runtime closed"))
        self._calls.clear()

    def served_models(self) -> list[str]:
        return [self.model_name]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the worker off starting new batches, so requests gather into one (tests)."""
        with self._cond:
            self._paused += 1
        try:
            yield
        finally:
            with self._cond:
                self._paused -= 1
                self._cond.notify_all()

    def queued(self) -> int:
        return len(self._queue)

    def idle(self) -> bool:
        return not self._queue and not self._batches

    def resident(self) -> dict[str, int]:
        """Runtime loads resident now: of the base model, LoRA adapters and full weights (/metrics)."""
        loads = list(self._loads.values())
        adapters = sum(1 for weights in loads if isinstance(weights, str))
        full = sum(1 for weights in loads if isinstance(weights, FullModel))
        return {"base": len(loads) - adapters - full, "adapter": adapters, "full": full}

    # -- releases ----------------------------------------------------------------------------

    async def load(self, content_id: str, files: Mapping[str, bytes]) -> str:
        """Empty content (or content without weights) serves the base model; a peft LoRA
        adapter becomes one more resident adapter, named after its load; full weights become a
        model of their own, read off the worker thread (serving goes on meanwhile)."""
        n = next(self._counter)
        load_id = f"{self._incarnation}:{n}"
        if weights_kind(files) == "full":
            try:
                model = await asyncio.to_thread(load_full_model, files, torch.float32)
            except Exception as exc:
                raise RuntimeFailure(f"cannot load content {content_id} as full weights: {exc}") from exc
            self._loads[load_id] = FullModel(model)
            return load_id
        adapter_files = adapter_part(files)
        if adapter_files is None:
            self._loads[load_id] = None
            return load_id
        name = f"reef_{n}"
        try:
            await self.run_in_worker(partial(self._add_adapter, name, adapter_files))
        except RuntimeFailure:
            raise
        except Exception as exc:
            raise RuntimeFailure(f"cannot load content {content_id} as a LoRA adapter: {exc}") from exc
        self._loads[load_id] = name
        return load_id

    async def unload(self, runtime_load_id: str) -> None:
        weights = self._loads.pop(runtime_load_id, None)
        self._prefixes.pop(runtime_load_id, None)
        if isinstance(weights, str):  # a full-weight model goes with the last batch that holds it
            await self.run_in_worker(partial(self._drop_adapter, weights))

    async def run_in_worker(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the worker thread between decoding steps (the model's only owner)."""
        if self._worker is None:
            raise RuntimeFailure("the embedded runtime is not started")
        future: Future[Any] = Future()
        with self._cond:
            self._calls.append((fn, future))
            self._cond.notify_all()
        return await asyncio.wrap_future(future)

    def _add_adapter(self, name: str, files: dict[str, bytes]) -> None:
        with tempfile.TemporaryDirectory(prefix="reef-adapter-") as folder:
            for file_name, data in files.items():
                (Path(folder) / file_name).write_bytes(data)
            try:
                with _transformers_quiet():
                    self.model.load_adapter(folder, adapter_name=name)
            except Exception:
                if name in (getattr(self.model, "peft_config", None) or {}):
                    self.model.delete_adapter(name)  # no half-injected adapter stays behind
                raise
        self._adapters.add(name)

    def _drop_adapter(self, name: str) -> None:
        if any(batch.adapter == name for batch in self._batches.values()):
            self._doomed.add(name)  # a batch still decodes with it; drop it when its turn ends
            return
        self.model.delete_adapter(name)
        self._adapters.discard(name)

    # -- generation: the async side ------------------------------------------------------------

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        return prompt_ids(self.tokenizer, request)  # chatml's function (a method's name is not in scope here)

    async def count_tokens(self, request: ChatRequest) -> int:
        return len(self.prompt_ids(request))

    async def generate(self, request: ChatRequest, release: ReleaseRef) -> AsyncIterator[Delta]:
        queue: asyncio.Queue[object] = asyncio.Queue()
        job = self._make_job(
            request, release, partial(asyncio.get_running_loop().call_soon_threadsafe, queue.put_nowait)
        )
        job.queued_at = time.monotonic()
        with self._cond:
            self._queue.append(job)
            self._cond.notify_all()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
                if isinstance(item, Finish):
                    return
        finally:
            job.cancelled.set()  # the consumer left (or finished): stop decoding this row

    def _make_job(self, request: ChatRequest, release: ReleaseRef, emit: Callable[[object], None]) -> Job:
        if self._worker is None:
            raise RuntimeFailure("the embedded runtime is not started")
        load_id = release.runtime_load_id
        if load_id is None or load_id not in self._loads:
            raise RuntimeFailure(f"runtime load {load_id!r} of release {release.release_id} is not loaded here")
        prompt = self.prompt_ids(request)
        room = self.max_context - len(prompt)
        if room < 1:
            raise RuntimeFailure(
                f"the prompt has {len(prompt)} tokens; the model's context is {self.max_context}",
                status=400,
                error_type="invalid_request_error",
            )
        watch_tools = bool(request.tools) and request.tool_choice != "none"
        decode = partial(self.tokenizer.decode, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        seed = request.seed if request.seed is not None else secrets.randbits(63)
        return Job(
            prompt_ids=prompt,
            load_id=load_id,
            max_tokens=max(1, min(request.max_tokens or self.default_max_tokens, room)),
            temperature=1.0 if request.temperature is None else float(request.temperature),
            top_p=1.0 if request.top_p is None else float(request.top_p),
            generator=torch.Generator().manual_seed(seed % 2**64),  # any integer a client sends is a valid seed
            text=TextStream(decode, request.stop, watch_tools),
            emit=emit,
        )

    # -- generation: the worker ----------------------------------------------------------------

    def _work(self) -> None:
        while (batch := self._next_turn()) is not None:
            try:
                self._run_turn(batch)
            except Exception as exc:  # a broken batch fails its requests, not the worker
                for job in batch.jobs:
                    job.send(RuntimeFailure(f"the embedded model failed: {exc}"))
                batch.clear()
            finally:
                with self._cond:
                    batch.turn_ended = time.monotonic()
                    if not batch.jobs:
                        self._batches.pop(batch.load_id, None)
                doomed, self._doomed = self._doomed, set()
                for name in doomed:
                    with contextlib.suppress(Exception):  # a leaked adapter must not stop serving
                        self._drop_adapter(name)  # dooms it again while a parked batch still uses it

    def _next_turn(self) -> Batch | None:
        while True:
            self._run_calls()
            with self._cond:
                if self._closing:
                    return None
                if self._calls:
                    continue
                batch = None if self._paused else self._take_turn()
                if batch:
                    return batch
                if not self._queue or self._paused:
                    self._cond.wait()

    def _take_turn(self) -> Batch | None:
        """The load whose work has waited longest, its batch (new, or parked at the end of its
        last turn). Loads take turns: when another load has work, the last turn's load goes after
        it, so a burst for one load (a gate judging a candidate: dozens of requests at once) never
        stalls live traffic on the serving load for more than one turn."""
        self._queue = [job for job in self._queue if not job.cancelled.is_set()]
        since: dict[str, float] = {load_id: b.turn_ended for load_id, b in self._batches.items()}
        for job in self._queue:
            since[job.load_id] = min(since.get(job.load_id, job.queued_at), job.queued_at)
        if not since:
            return None
        others = {load_id: t for load_id, t in since.items() if load_id != self._last_load_id}
        load_id = min(others or since, key=lambda k: (others or since)[k])
        self._last_load_id = load_id
        batch = self._batches.get(load_id)
        if batch is None:
            if load_id not in self._loads:
                self._fail_queued(load_id, f"runtime load {load_id} was unloaded")
                return None
            weights = self._loads[load_id]
            batch = self._batches[load_id] = Batch(load_id, weights if isinstance(weights, str) else None)
            batch.full = weights if isinstance(weights, FullModel) else None
        return batch

    def _fail_queued(self, load_id: str, message: str) -> None:
        failed = [job for job in self._queue if job.load_id == load_id]
        self._queue = [job for job in self._queue if job.load_id != load_id]
        for job in failed:
            job.send(RuntimeFailure(message))

    def _joiners(self, batch: Batch) -> list[Job]:
        """Queued requests of the batch's load, as many as it has room for (under the lock)."""
        with self._cond:
            if batch.load_id not in self._loads:
                self._fail_queued(batch.load_id, f"runtime load {batch.load_id} was unloaded")
                return []
            room = self.max_batch - len(batch.jobs)
            joining = [job for job in self._queue if job.load_id == batch.load_id and not job.cancelled.is_set()][:room]
            self._queue = [job for job in self._queue if job not in joining]
            batch.jobs.extend(joining)  # in the batch from now on: close() reaches them
            return joining

    def _others_waiting(self, load_id: str) -> bool:
        with self._cond:
            return any(job.load_id != load_id for job in self._queue) or any(
                other != load_id and b.jobs for other, b in self._batches.items()
            )

    def _run_calls(self) -> None:
        with self._cond:
            calls, self._calls = self._calls, []
        for fn, future in calls:
            if not future.set_running_or_notify_cancel():
                continue  # its caller was cancelled and will not look at the outcome
            try:
                with torch.inference_mode(False):  # adapters must stay trainable tensors
                    future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)
        if calls:
            self._active = _UNSET  # whatever they did to the adapters, set ours again

    def _apply_adapter(self, adapter: str | None) -> None:
        if self._active == adapter:
            return
        if adapter is None:
            if self._adapters:
                self.model.disable_adapters()
        else:
            self.model.enable_adapters()
            self.model.set_adapter(adapter)
        self._active = adapter

    def _run_turn(self, batch: Batch) -> None:
        """Decode `batch` until its rows end, or for `turn_steps` steps while another load has
        work. With continuous batching, queued requests of its load join it between steps
        (prefilled on their own, their KV rows merged in); without, a turn is one batch from
        start to end, joined by nothing."""
        steps = 0
        with torch.inference_mode():
            while True:
                if batch.full is None:
                    self._apply_adapter(batch.adapter)
                if steps == 0 or self.continuous:
                    self._admit(batch)
                if not batch.jobs:
                    return
                self._step(batch)
                steps += 1
                self._run_calls()
                if not self.continuous:
                    continue
                if (not batch.jobs or steps >= self.turn_steps) and self._others_waiting(batch.load_id):
                    return

    def _admit(self, batch: Batch) -> None:
        joining = self._joiners(batch)
        if not joining:
            return
        self.batches_run += 1
        self.requests_run += len(joining)
        if self.batch_observer is not None:
            now = time.monotonic()
            with contextlib.suppress(Exception):  # a metrics hook never fails a batch
                self.batch_observer(len(joining), [now - job.queued_at for job in joining])
        from transformers import DynamicCache

        cache = DynamicCache(config=self._model_of(batch).config)
        logits, mask, positions = self._prefill(joining, cache, batch)
        batch.merge(cache, mask, positions[:, -1:], logits)

    def _step(self, batch: Batch) -> None:
        """Sample every row's next token from the batch's logits, drop the rows that ended, and
        run the rest one step on."""
        keep = [i for i, job in enumerate(batch.jobs) if self._advance(job, batch.logits[i])]
        if len(keep) < len(batch.jobs):  # finished or abandoned rows leave the batch
            batch.keep(keep)
        if not batch.jobs:
            return
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch.jobs), 1)], dim=1)
        batch.positions = batch.positions + 1
        step = torch.tensor([[job.ids[-1]] for job in batch.jobs])
        batch.logits = self._forward(self._model_of(batch), step, batch.mask, batch.positions, batch.cache)

    def _prefill(self, jobs: list[Job], cache: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the prompts into `cache`; return the next-token logits, the attention mask and the
        position ids. Prefill is most of a batch's cost, and prompts often share a long start (a
        system prompt, an agent's instructions): that prefix runs once, with batch size one, its
        KV rows are copied to every row, and only the suffixes (left-padded) run batched after it:
        mask `[1]*P + [0]*pad + [1]*suffix`, positions going on from P. The prefix is the one the
        jobs share, or, when longer, the one they share with the load's last prompt start
        prefilled alone (kept, so requests that join a running batch one at a time reuse it)."""
        load_id, model = batch.load_id, self._model_of(batch)
        prompts = [job.prompt_ids for job in jobs]
        shared = shared_prefix_length(prompts, self.min_shared_prefix)
        last = self._prefixes.get(load_id)
        reused = last.reusable(prompts, self.min_shared_prefix) if last is not None else 0
        if reused > shared:
            shared = reused
            for index, (keys, values) in enumerate(last.layers):
                cache.update(keys[..., :shared, :], values[..., :shared, :], index)
            self.reused_prefix_tokens += shared * len(jobs)
        elif shared:
            prefix = torch.tensor([prompts[0][:shared]])
            self._forward(model, prefix, torch.ones_like(prefix), torch.arange(shared)[None], cache)
            self._remember_prefix(load_id, prompts[0][:shared], cache)
            self.shared_prefix_tokens += shared * (len(jobs) - 1)
        if shared:
            cache.batch_repeat_interleave(len(jobs))
        suffixes = [prompt[shared:] for prompt in prompts]
        width = max(len(suffix) for suffix in suffixes)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.tensor([[pad] * (width - len(s)) + s for s in suffixes])
        suffix_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in suffixes])
        positions = shared + (suffix_mask.cumsum(-1) - 1).clamp(min=0)  # left padding: each row counts on from P
        mask = torch.cat([suffix_mask.new_ones(len(jobs), shared), suffix_mask], dim=1)
        logits = self._forward(model, ids, mask, positions, cache)
        if len(jobs) == 1 and self.min_shared_prefix:
            self._remember_prefix(load_id, prompts[0], cache)  # unpadded: the next joiner may share its start
        return logits, mask, positions

    def _remember_prefix(self, load_id: str, ids: list[int], cache: Any) -> None:
        if load_id in self._loads:  # not for a load unloaded meanwhile
            self._prefixes[load_id] = Prefix(list(ids), [(layer.keys, layer.values) for layer in cache.layers])

    def _model_of(self, batch: Batch) -> Any:
        """The model a batch decodes on: its full-weight release's own, else the shared one (with
        the batch's adapter set)."""
        return batch.full.model if batch.full is not None else self.model

    def _forward(
        self, model: Any, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()

    def _advance(self, job: Job, logits: torch.Tensor) -> bool:
        """Sample one token for `job`, stream it, and say whether the row goes on."""
        if job.cancelled.is_set():
            return False
        token, logprob = sample(logits, job.temperature, job.top_p, job.generator)
        job.ids.append(token)
        job.logprobs.append(logprob)
        self.tokens_generated += 1
        reason: FinishReason | None = None
        if token in self._stop_ids:
            text, reason = "", "stop"
        else:
            text = job.text.push(job.ids)
            if job.text.stopped:
                reason = "stop"
            elif len(job.ids) >= job.max_tokens:
                reason = "length"
        job.send(TextDelta(text, (token,), (logprob,), job.load_id))
        if reason is None:
            return True
        self._finish(job, reason)
        return False

    def _finish(self, job: Job, reason: FinishReason) -> None:
        text_ids = [t for t in job.ids if t not in self._stop_ids]
        rest, calls = job.text.finish(text_ids)
        if rest:
            job.send(TextDelta(rest, (), (), job.load_id))
        for index, call in enumerate(calls):
            job.send(ToolCallDelta(call, index))
        usage = Usage(prompt_tokens=len(job.prompt_ids), completion_tokens=len(job.ids))
        job.send(
            Finish(
                "tool_calls" if calls else reason, usage, model=self.model_name, prompt_token_ids=tuple(job.prompt_ids)
            )
        )


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[None]:
    """transformers 5 prints a "LOAD REPORT" calling every LoRA weight of a named adapter
    MISSING ("newly initialized") while peft loads those very weights right after (checked: the
    loaded lora_B equals the file's). On every publish that misleads whoever reads the log."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
