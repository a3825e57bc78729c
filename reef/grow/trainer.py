"""The training primitives on a LoRA adapter: fp32 on the CPU, as the embedded runtime samples
(`learner.device` / `learner.dtype` put it on a GPU in the engine's dtype).

A recipe trains through five calls, each naming a key (a scenario) whose adapter and AdamW
state stay resident between calls, the way tinker's training client works:

    load_state(key, checkpoint, lora)        start from a checkpoint (adapter + optimiser), or fresh
    forward_backward(key, data, loss, cfg)   add the gradient of a named loss over `Datum`s
    optim_step(key, adam)                    one AdamW step on the accumulated gradient
    save_state(key)                          the checkpoint: adapter files + optimiser moments and step
    logprobs(adapter, sequences)             per-token log-probs under an adapter or the base
    generate(adapter, requests, max_tokens)  greedy answers under an adapter or the base (the gate's)

A checkpoint is a release's weights content: peft's two adapter files at the root and, under
`training/`, AdamW's moments and step count (`reef.grow.checkpoint`), so a restart, a rollback
or training on from a judged candidate continues the optimiser where it was. Loading the
checkpoint a key last saved keeps the resident state; anything else replaces it.

Everything that makes the importance ratio exactly 1 on-policy mirrors `reef.runtimes.embedded`:
the same fp32 weights, left padding with position ids `cumsum(mask) - 1`, logits divided by the
rollout's temperature (greedy rollouts record temperature-1 log-probs, so 0 counts as 1).
Completion tokens are found by position, never by id: the pad id is the EOS id (2), which also
ends every ChatML turn inside the prompt. One caller at a time: the worker process serialises calls.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import math
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from reef.core.chat import ChatRequest
from reef.core.prefix import MIN_SHARED_PREFIX, shared_prefix_length
from reef.core.training import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdamParams,
    Datum,
    LoraShape,
    LossConfig,
    Sample,
    TrainConfig,
    adapter_part,
    checkpoint_part,
)
from reef.grow.checkpoint import optimizer_files, restore_optimizer
from reef.grow.losses import kl_to_base, log_ratio, loss_function
from reef.runtimes.chatml import MAX_CONTEXT, TextStream, prompt_ids, stop_token_ids

GENERATE_BATCH = 16  # rows decoded together by `generate`

__all__ = ["LoRATrainer", "Sample", "TrainConfig", "adapter_hash", "adapter_part", "warmed_up_lr"]

# peft 0.21 asks transformers 5.23 a deprecated question when wrapping a model; harmless here
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
# one adapter per key plus temporary ones for log-probs: many adapters is the design, not a slip
warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute", category=UserWarning)
warnings.filterwarnings("ignore", message=r"Adapter \S+ was active which is now deleted", category=UserWarning)


def warmed_up_lr(config: TrainConfig, steps_taken: int) -> float:
    return config.adam.lr_at(steps_taken)


def adapter_hash(files: dict[str, bytes]) -> str:
    """Identity of an adapter's bytes, to tell whether a resident adapter holds them."""
    return files_hash(files, (ADAPTER_CONFIG, ADAPTER_WEIGHTS))


def files_hash(files: dict[str, bytes], names: Any = None) -> str:
    digest = hashlib.sha256()
    for name in sorted(files) if names is None else names:
        data = files.get(name, b"")
        digest.update(f"{name}:{len(data)}:".encode())
        digest.update(data)
    return digest.hexdigest()


@dataclass
class _Slot:
    """One key's adapter inside the shared peft model, and the optimiser that trains it."""

    name: str  # the peft adapter name (keys may hold characters module names cannot)
    names: list[str]  # its parameters' names without the adapter name, as checkpoints store them
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.AdamW
    seed: int
    steps: int = 0
    checkpoint_hash: str = ""  # of the checkpoint it was loaded from or last saved as; "" once it moved
    adapter_hash: str = ""


class LoRATrainer:
    def __init__(
        self,
        model_dir: Path,
        threads: int | None = None,
        device: str = "auto",
        dtype: str = "auto",
        engine_dtype: str | None = None,
        min_shared_prefix: int = MIN_SHARED_PREFIX,
    ) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if threads:
            torch.set_num_threads(threads)  # process-wide; the worker process owns its own pool
        self.model_dir = Path(model_dir)
        self.device = torch.device(resolve_device(device))
        self.dtype = resolve_dtype(dtype, self.device.type, engine_dtype)
        self.base: Any = (
            AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=self.dtype).to(self.device).eval()
        )
        self.base.requires_grad_(False)
        self.pad_id = int(self.base.config.pad_token_id or 0)  # any id will do: pads are masked out
        self.peft: Any = None  # the PeftModel wrapping `base`, made with the first adapter
        self._slots: dict[str, _Slot] = {}
        self._names = itertools.count(1)
        self.min_shared_prefix = min_shared_prefix
        self.shared_prefix_tokens = 0  # prompt tokens not run again thanks to a shared prefix
        self.tokenizer: Any = None  # loaded for the first `generate`

    # -- the primitives -------------------------------------------------------------------------

    def load_state(self, key: str, checkpoint: dict[str, bytes] | None, lora: LoraShape) -> dict[str, float]:
        """Make `key` train from `checkpoint` (a release's content, or None for a fresh adapter
        shaped by `lora`), its optimiser restored when the checkpoint carries one. The
        checkpoint `key` last loaded or saved keeps its resident state (the same numbers)."""
        checkpoint = checkpoint_part(checkpoint)
        wanted = files_hash(checkpoint) if checkpoint is not None else ""
        slot = self._slots.get(key)
        if slot is not None and wanted and wanted == slot.checkpoint_hash:
            return {"steps": float(slot.steps), "resumed": 1.0}
        name = self._add_adapter(adapter_part(checkpoint), lora)
        if slot is not None:
            self.peft.delete_adapter(slot.name)
        self.peft.set_adapter(name)  # trainable: requires_grad on this adapter only
        named = [(n, p) for n, p in self.peft.named_parameters() if name in n.split(".")]
        names = [".".join(part for part in n.split(".") if part != name) for n, _ in named]
        params = [p for _, p in named]
        slot = _Slot(
            name,
            names,
            params,
            torch.optim.AdamW(params),
            lora.seed,
            checkpoint_hash=wanted,
            adapter_hash=adapter_hash(checkpoint) if checkpoint is not None else "",
        )
        slot.steps = restore_optimizer(slot.optimizer, names, checkpoint or {})
        self._slots[key] = slot
        return {"steps": float(slot.steps), "resumed": 0.0}

    def forward_backward(self, key: str, data: list[Datum], loss: str, config: LossConfig) -> dict[str, float]:
        """Add to `key`'s gradient that of `loss`'s mean over the tokens it keeps in `data`
        (gradients of earlier calls since the last `optim_step` stay, summed)."""
        started = time.monotonic()
        loss_fn = loss_function(loss)
        for i, datum in enumerate(data):
            try:
                datum.check(loss)
            except ValueError as exc:
                raise ValueError(f"datum {i}: {exc}") from None
        slot = self._slot(key)
        earlier = [p.grad for p in slot.params]
        for p in slot.params:
            p.grad = None
        rows = [d for d in data if d.completion_ids]
        total = sum(len(d.completion_ids) for d in rows)
        sums = dict(loss=0.0, ratio=0.0, kept=0.0, outside=0.0, kl=0.0, max_log_ratio=0.0)
        with torch.random.fork_rng():  # LoRA dropout draws from a seeded generator, not the caller's
            torch.manual_seed(slot.seed * 1_000_003 + slot.steps)
            self.peft.set_adapter(slot.name)
            self.peft.train()
            try:
                size = max(1, config.micro_batch)
                for start in range(0, len(rows), size):
                    self._accumulate(rows[start : start + size], loss, loss_fn, config, sums)
            finally:
                self.peft.eval()
        kept = int(sums["kept"])
        for p, before in zip(slot.params, earlier):
            if p.grad is not None and kept:
                p.grad.div_(kept)  # the losses were summed; the mean is over this call's kept tokens
            if before is not None:
                p.grad = before if p.grad is None else p.grad + before
        return {
            "loss": sums["loss"] / kept if kept else 0.0,
            "mean_ratio": sums["ratio"] / total if total else 1.0,
            "max_abs_log_ratio": sums["max_log_ratio"],
            "clipped_fraction": (total - kept) / total if total else 0.0,  # tokens that did not count
            "outside_clip_fraction": sums["outside"] / total if total else 0.0,  # ratio off (1 - eps, 1 + eps_high)
            "kl": sums["kl"] / kept if kept else 0.0,
            "tokens": float(total),
            "samples": float(len(data)),
            "seconds": time.monotonic() - started,
        }

    def optim_step(self, key: str, adam: AdamParams) -> dict[str, float]:
        """One AdamW step on the accumulated gradient (clipped to `max_grad_norm`), then clear
        it. Without a gradient (every token masked) or with a non-finite one, no step is taken."""
        slot = self._slot(key)
        grads = [p for p in slot.params if p.grad is not None]
        grad_norm = 0.0
        if grads:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(slot.params, adam.max_grad_norm))
            if math.isfinite(grad_norm):
                for group in slot.optimizer.param_groups:
                    group["lr"], group["weight_decay"] = adam.lr_at(slot.steps), adam.weight_decay
                slot.optimizer.step()
                slot.steps += 1
                slot.checkpoint_hash = slot.adapter_hash = ""
        slot.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "steps": float(slot.steps)}

    def save_state(self, key: str) -> dict[str, bytes]:
        """`key`'s checkpoint: its adapter files and its optimiser's state."""
        slot = self._slot(key)
        files = {**self._save(slot.name), **optimizer_files(slot.optimizer, slot.names, slot.steps)}
        slot.checkpoint_hash, slot.adapter_hash = files_hash(files), adapter_hash(files)
        return files

    def step(
        self, key: str, checkpoint: dict[str, bytes] | None, samples: list[Sample], config: TrainConfig
    ) -> tuple[dict[str, bytes], dict[str, float]]:
        """One SAO step, the primitives in order: load, clipped-IS forward-backward, AdamW, save."""
        started = time.monotonic()
        self.load_state(key, checkpoint, config.lora)
        metrics = self.forward_backward(key, [s.datum() for s in samples], config.loss, config.loss_config)
        metrics.update(self.optim_step(key, config.adam))
        files = self.save_state(key)
        metrics["seconds"] = time.monotonic() - started
        return files, metrics

    def _slot(self, key: str) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            raise ValueError(f"no training state for {key!r}: load_state it first")
        return slot

    def _accumulate(
        self, rows: list[Datum], loss: str, loss_fn: Any, config: LossConfig, sums: dict[str, float]
    ) -> None:
        """Forward and backward one micro-batch, adding the summed (not averaged) loss's grads."""
        seqs = [(d.prompt_ids, d.completion_ids) for d in rows]
        temps = [d.temperature for d in rows]
        base_lp = None
        if config.kl_coef > 0:
            with torch.no_grad(), self._base_only():
                base_lp, _ = self._completion_logprobs(seqs, temps)
        new_lp, real = self._completion_logprobs(seqs, temps)
        width = new_lp.shape[1]

        def aligned(rows_: list[list[float]]) -> torch.Tensor:
            return _right_aligned(rows_, width).to(self.device)

        old_lp = new_lp.detach() if loss == "cross_entropy" else aligned([d.behaviour_logprobs for d in rows])
        weights = aligned([d.mask for d in rows])
        advantages = aligned([d.advantages for d in rows])
        live = real & (weights > 0)
        per_token, keep = loss_fn(new_lp, old_lp, advantages, live, config)
        if base_lp is not None:
            k3 = kl_to_base(new_lp, base_lp, live)
            per_token = per_token + config.kl_coef * k3
            sums["kl"] += float(torch.where(keep, k3.detach(), 0.0).sum())
        total = torch.where(keep, per_token * weights, torch.zeros_like(per_token)).sum()
        if bool(keep.any()):
            total.backward()
        ratio = log_ratio(new_lp.detach(), old_lp, real)
        sums["loss"] += float(total.detach())
        sums["ratio"] += float(torch.where(real, ratio.exp(), 0.0).sum())
        sums["kept"] += float(keep.sum())
        inside = (ratio > math.log1p(-config.eps_clip)) & (ratio < math.log1p(config.eps_clip_high))
        sums["outside"] += float((live & ~inside).sum())
        sums["max_log_ratio"] = max(sums["max_log_ratio"], float(ratio.abs().max()))

    # -- log-probs ----------------------------------------------------------------------------

    def logprobs(
        self,
        adapter_files: dict[str, bytes] | None,
        sequences: list[tuple[list[int], list[int]]],
        temperature: float = 1.0,
    ) -> list[list[float]]:
        """Per-token log-probs of each completion given its prompt, under the base model (None)
        or an adapter: the gate's offline check, and the tests' on-policy check."""
        for prompt, _ in sequences:
            if not prompt:
                raise ValueError("every sequence needs a non-empty prompt")
        out: list[list[float]] = [[] for _ in sequences]
        todo = [i for i, (_, completion) in enumerate(sequences) if completion]
        with torch.no_grad(), self._adapter_only(adapter_part(adapter_files)):
            for start in range(0, len(todo), 8):
                chunk = todo[start : start + 8]
                lp, _ = self._completion_logprobs([sequences[i] for i in chunk], [temperature] * len(chunk))
                for row, i in enumerate(chunk):
                    n = len(sequences[i][1])
                    out[i] = lp[row, lp.shape[1] - n :].tolist()
        return out

    # -- greedy answers -------------------------------------------------------------------------

    def generate(
        self, adapter_files: dict[str, bytes] | None, requests: list[ChatRequest], max_tokens: int
    ) -> list[str]:
        """Each request's greedy answer under the base model (None) or an adapter, as the embedded
        runtime would write it (the same prompt ids, stop tokens and text decoding): the gate's
        tasks answered here while the learner waits for samples (`gate.answer_on: trainer`). As
        there, an answer stops where the context (`MAX_CONTEXT`) ends, and a prompt that fills it
        is refused."""
        tokenizer = self._tokenizer()
        stops = stop_token_ids(tokenizer)
        decode = functools.partial(tokenizer.decode, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        answers: list[str] = []
        with torch.no_grad(), self._adapter_only(adapter_part(adapter_files)):
            for start in range(0, len(requests), GENERATE_BATCH):
                chunk = requests[start : start + GENERATE_BATCH]
                prompts = [prompt_ids(tokenizer, r) for r in chunk]
                for request, ids in zip(chunk, self._greedy(prompts, answer_room(prompts, max_tokens), stops)):
                    answers.append(TextStream(decode, request.stop, watch_tools=False).finish(ids)[0])
        return answers

    def _greedy(self, prompts: list[list[int]], max_tokens: list[int], stops: frozenset[int]) -> list[list[int]]:
        """The argmax continuation of each prompt, up to its first stop token (left out) or its
        row's `max_tokens`: left padding and position ids `cumsum(mask) - 1`, a key-value cache.
        The prompts' shared prefix (the gate's worked example and instructions) runs once, as in
        the embedded runtime's prefill, and only the last position's logits are computed."""
        shared = shared_prefix_length(prompts, self.min_shared_prefix)
        ids, attention, positions, cache = self._after_prefix(prompts[0][:shared], [p[shared:] for p in prompts])
        out: list[list[int]] = [[] for _ in prompts]
        live = list(range(len(prompts)))
        step = self.base(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        for _ in range(max(max_tokens)):
            chosen = step.logits[:, -1, :].float().argmax(-1)
            for row in list(live):
                token = int(chosen[row])
                if token not in stops:
                    out[row].append(token)
                if token in stops or len(out[row]) >= max_tokens[row]:
                    live.remove(row)
            if not live:
                break
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
            step = self.base(
                input_ids=chosen.unsqueeze(-1),
                attention_mask=attention,
                position_ids=positions,
                past_key_values=step.past_key_values,
                use_cache=True,
                logits_to_keep=1,
            )
        return out

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        return self.tokenizer

    def _completion_logprobs(
        self, seqs: list[tuple[list[int], list[int]]], temps: list[float]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs [B, C] of the completions, right-aligned (C = the longest completion), and the
        mask of real completion positions. Left padding and `cumsum(mask) - 1` positions, as in
        generation; logits only for the last C + 1 positions (the 49k vocabulary is the cost).

        Rows sharing a long prompt prefix (a system prompt, a worked example) run it once: its
        keys and values, repeated to the batch, are the cache the rows' suffixes (the rest of the
        prompt plus the completion) attend to, left-padded after it. The numbers are the same;
        with gradients on they flow back through the cache into the adapter on the prefix."""
        shared = shared_prefix_length([p for p, _ in seqs], self.min_shared_prefix)
        longest = max(len(c) for _, c in seqs)
        ids, attention, positions, cache = self._after_prefix(seqs[0][0][:shared], [p[shared:] + c for p, c in seqs])
        width = ids.shape[1]
        logits = (
            self.base(
                input_ids=ids,
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=cache is not None,
                logits_to_keep=longest + 1,
            )
            .logits[:, :-1, :]
            .float()
        )
        scale = torch.tensor([t if t > 0 else 1.0 for t in temps], dtype=torch.float32, device=self.device).view(
            -1, 1, 1
        )
        logprobs = torch.log_softmax(logits / scale, dim=-1)
        targets = ids[:, width - longest :]
        picked = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        lengths = torch.tensor([len(c) for _, c in seqs], device=self.device).unsqueeze(1)
        mask = torch.arange(longest, device=self.device).unsqueeze(0) >= (longest - lengths)
        return picked, mask

    def _after_prefix(
        self, prefix: list[int], rows: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """Rows that all follow `prefix` (empty: none shared), as one batch: the rows' ids left
        padded, the attention mask over prefix and row, the rows' position ids counting on from the
        prefix, and the prefix's key/value cache repeated to the batch (None without a prefix)."""
        shared = len(prefix)
        width = max(len(r) for r in rows)
        ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows], device=self.device)
        attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        positions = shared + (attention.cumsum(-1) - 1).clamp(min=0)
        cache = None
        if shared:
            cache = self._prefix_cache(prefix, len(rows))
            attention = torch.cat([torch.ones_like(attention[:, :1]).expand(-1, shared), attention], dim=1)
            self.shared_prefix_tokens += shared * (len(rows) - 1)
        return ids, attention, positions, cache

    def _prefix_cache(self, prefix: list[int], batch: int) -> Any:
        """The key/value cache of `prefix` (positions 0..P-1), run once and repeated `batch` times
        along the batch (`repeat_interleave`: autograd sees the copies, gradients sum back)."""
        ids = torch.tensor([prefix], device=self.device)
        positions = torch.arange(len(prefix), device=self.device).unsqueeze(0)
        cache = self.base(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1).past_key_values
        cache.batch_repeat_interleave(batch)
        return cache

    # -- adapters -----------------------------------------------------------------------------

    def _add_adapter(self, files: dict[str, bytes] | None, lora: LoraShape) -> str:
        """Inject a new adapter: fresh, shaped by `lora` (B = 0, so it equals the base model), or
        with the weights and shape of `files` (their own LoRA config wins over `lora`)."""
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
        from safetensors.torch import load as load_safetensors

        name = f"a{next(self._names)}"
        if files is None:
            config = LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules)
            )
        else:
            if ADAPTER_CONFIG not in files or ADAPTER_WEIGHTS not in files:
                raise ValueError(f"adapter files need {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}, got {sorted(files)}")
            with tempfile.TemporaryDirectory(prefix="reef-train-") as folder:
                (Path(folder) / ADAPTER_CONFIG).write_bytes(files[ADAPTER_CONFIG])
                config = LoraConfig.from_pretrained(folder)
            config.inference_mode = False
        with torch.random.fork_rng():  # A's random init is seeded, and leaves the caller's RNG alone
            torch.manual_seed(lora.seed)
            if self.peft is None:
                self.peft = get_peft_model(self.base, config, adapter_name=name)
            else:
                self.peft.add_adapter(name, config)
        if files is not None:
            try:
                result = set_peft_model_state_dict(
                    self.peft, load_safetensors(files[ADAPTER_WEIGHTS]), adapter_name=name
                )
                missing = [k for k in result.missing_keys if f".{name}." in k]
                if result.unexpected_keys or missing:
                    raise ValueError(
                        f"adapter weights do not fit: unexpected {result.unexpected_keys[:3]}, missing {missing[:3]}"
                    )
            except Exception:
                self.peft.delete_adapter(name)
                raise
        return name

    def _save(self, name: str) -> dict[str, bytes]:
        """The adapter as peft's `save_pretrained` writes it (a named adapter lands in a sub-folder),
        except that `target_modules`, a set that peft writes in hash order, is sorted: otherwise
        the same adapter has other bytes, and another content id, in every process."""
        with tempfile.TemporaryDirectory(prefix="reef-train-") as folder:
            self.peft.save_pretrained(folder, selected_adapters=[name])
            files = {f: (Path(folder) / name / f).read_bytes() for f in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)}
        fields = json.loads(files[ADAPTER_CONFIG])
        if isinstance(fields.get("target_modules"), list):
            fields["target_modules"] = sorted(fields["target_modules"])
            files[ADAPTER_CONFIG] = json.dumps(fields, indent=2, sort_keys=True).encode()  # peft's own layout
        return files

    @contextlib.contextmanager
    def _base_only(self) -> Iterator[None]:
        if self.peft is None or not self.peft.peft_config:
            yield
            return
        if self.peft.active_adapter not in self.peft.peft_config:  # it was a deleted temporary one
            self.peft.set_adapter(next(iter(self.peft.peft_config)), inference_mode=True)
        with self.peft.disable_adapter():
            yield

    @contextlib.contextmanager
    def _adapter_only(self, files: dict[str, bytes] | None) -> Iterator[None]:
        """Run with `files` active: a resident key's adapter when the bytes match, else a
        temporary one removed afterwards; None runs the base model."""
        if files is None:
            with self._base_only():
                yield
            return
        wanted = adapter_hash(files)
        resident = next((s.name for s in self._slots.values() if s.adapter_hash == wanted), None)
        name = resident or self._add_adapter(files, LoraShape())
        try:
            self.peft.set_adapter(name, inference_mode=resident is None)
            yield
        finally:
            if resident is None:
                self.peft.delete_adapter(name)


def resolve_device(device: str) -> str:
    """`learner.device`: auto takes CUDA when torch sees a GPU, else the CPU; cuda without a
    GPU is an error that says why, not a silent fall back to a hundred times slower training."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise RuntimeError(
            f"learner.device is {device!r} but torch {torch.__version__} ({build}) sees no CUDA "
            "device; use learner.device: cpu or auto"
        )
    return device


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device_type: str, engine_dtype: str | None) -> torch.dtype:
    """`learner.dtype`: auto is fp32 on the CPU (the embedded runtime's, and bf16 moved on-policy
    ratios by up to 1.57 there) and the engine's dtype on a GPU (bf16 unless the engine says
    otherwise), so the trainer's log-probs are those of the weights the engine samples from."""
    if dtype != "auto":
        return DTYPES[dtype]
    if device_type == "cpu":
        return torch.float32
    return DTYPES.get(engine_dtype or "", torch.bfloat16)


def _right_aligned(rows: list[list[float]], width: int) -> torch.Tensor:
    return torch.tensor([[0.0] * (width - len(r)) + list(r) for r in rows], dtype=torch.float32)


def answer_room(prompts: list[list[int]], max_tokens: int) -> list[int]:
    """How many tokens each prompt's answer may take: `max_tokens`, cut where the context ends,
    as the embedded runtime cuts it; a prompt with no room left is refused."""
    for prompt in prompts:
        if len(prompt) >= MAX_CONTEXT:
            raise ValueError(f"the prompt has {len(prompt)} tokens; the model's context is {MAX_CONTEXT}")
    return [max(1, min(max_tokens, MAX_CONTEXT - len(prompt))) for prompt in prompts]
