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

The batching, log-probs, losses and greedy answers are `reef.grow.forward`'s, shared with the
full-weight trainer (`reef.grow.full_trainer`). One caller at a time: the worker process
serialises calls.
"""

from __future__ import annotations

import contextlib
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
from reef.core.prefix import MIN_SHARED_PREFIX
from reef.core.training import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdamParams,
    Datum,
    LoraShape,
    LossConfig,
    TrainConfig,
    adapter_part,
    checkpoint_part,
)
from reef.grow.checkpoint import optimizer_files, restore_optimizer
from reef.grow.forward import GENERATE_BATCH, SequenceModel, answer_room, check_data, forward_backward_metrics, new_sums
from reef.grow.losses import loss_function

__all__ = [
    "Datum",
    "GENERATE_BATCH",
    "LoRATrainer",
    "TrainConfig",
    "adapter_hash",
    "adapter_part",
    "answer_room",
    "warmed_up_lr",
]

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


class LoRATrainer(SequenceModel):
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
        on = torch.device(resolve_device(device))
        self.dtype = resolve_dtype(dtype, on.type, engine_dtype)
        self.base: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=self.dtype).to(on).eval()
        self.base.requires_grad_(False)
        super().__init__(Path(model_dir), int(self.base.config.pad_token_id or 0), on, min_shared_prefix)
        self.peft: Any = None  # the PeftModel wrapping `base`, made with the first adapter
        self._slots: dict[str, _Slot] = {}
        self._names = itertools.count(1)

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
        check_data(data, loss)
        slot = self._slot(key)
        earlier = [p.grad for p in slot.params]
        for p in slot.params:
            p.grad = None
        rows = [d for d in data if d.completion_ids]
        total = sum(len(d.completion_ids) for d in rows)
        sums = new_sums()
        with torch.random.fork_rng():  # LoRA dropout draws from a seeded generator, not the caller's
            torch.manual_seed(slot.seed * 1_000_003 + slot.steps)
            self.peft.set_adapter(slot.name)
            self.peft.train()
            try:
                size = max(1, config.micro_batch)
                for start in range(0, len(rows), size):
                    self._accumulate(
                        rows[start : start + size],
                        loss,
                        loss_fn,
                        config,
                        sums,
                        self._trained_logprobs,
                        self._base_logprobs,
                    )
            finally:
                self.peft.eval()
        kept = int(sums["kept"])
        for p, before in zip(slot.params, earlier):
            if p.grad is not None and kept:
                p.grad.div_(kept)  # the losses were summed; the mean is over this call's kept tokens
            if before is not None:
                p.grad = before if p.grad is None else p.grad + before
        return forward_backward_metrics(sums, total, len(data), started)

    def _trained_logprobs(
        self, seqs: list[tuple[list[int], list[int]]], temps: list[float]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._completion_logprobs(self.base, seqs, temps)  # the active adapter is in `base`

    def _base_logprobs(
        self, seqs: list[tuple[list[int], list[int]]], temps: list[float]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with self._base_only():
            return self._completion_logprobs(self.base, seqs, temps)

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
        self, key: str, checkpoint: dict[str, bytes] | None, data: list[Datum], config: TrainConfig
    ) -> tuple[dict[str, bytes], dict[str, float]]:
        """One optimiser step, the primitives in order: load, forward-backward of `config.loss`, AdamW, save."""
        started = time.monotonic()
        self.load_state(key, checkpoint, config.lora)
        metrics = self.forward_backward(key, data, config.loss, config.loss_config)
        metrics.update(self.optim_step(key, config.adam))
        files = self.save_state(key)
        metrics["seconds"] = time.monotonic() - started
        return files, metrics

    def _slot(self, key: str) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            raise ValueError(f"no training state for {key!r}: load_state it first")
        return slot

    # -- log-probs ----------------------------------------------------------------------------

    def logprobs(
        self,
        adapter_files: dict[str, bytes] | None,
        sequences: list[tuple[list[int], list[int]]],
        temperature: float = 1.0,
    ) -> list[list[float]]:
        """Per-token log-probs of each completion given its prompt, under the base model (None)
        or an adapter: the gate's offline check, and the tests' on-policy check."""
        with self._adapter_only(adapter_part(adapter_files)):
            return self._sequence_logprobs(self.base, sequences, temperature)

    # -- greedy answers -------------------------------------------------------------------------

    def generate(
        self, adapter_files: dict[str, bytes] | None, requests: list[ChatRequest], max_tokens: int
    ) -> list[str]:
        """Each request's greedy answer under the base model (None) or an adapter, as the embedded
        runtime would write it (the same prompt ids, stop tokens and text decoding): the gate's
        tasks answered here while the learner waits for samples (`gate.answer_on: trainer`). As
        there, an answer stops where the context (`MAX_CONTEXT`) ends, and a prompt that fills it
        is refused."""
        with self._adapter_only(adapter_part(adapter_files)):
            return self._answers(self.base, requests, max_tokens)

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
