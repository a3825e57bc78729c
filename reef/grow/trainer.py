"""One policy-gradient step on a LoRA adapter, in fp32 on the CPU, as the embedded runtime samples.

The learner gives rollouts (prompt ids, completion ids, the log-prob each token was recorded
with) and an advantage per rollout; this file turns them into a new adapter. Everything that
makes the importance ratio exactly 1 on-policy mirrors `reef.runtimes.embedded`: the same fp32
weights, left padding with position ids `cumsum(mask) - 1`, logits divided by the rollout's
temperature (greedy rollouts record temperature-1 log-probs, so 0 counts as 1). Completion
tokens are found by position, never by id: the pad id is the EOS id (2), which also ends every
ChatML turn inside the prompt. See docs/learning.md, "Measured before Reef".

Each key (a scenario) keeps its adapter resident in one peft model and its AdamW state in
memory, so consecutive steps continue the same optimiser; any other starting point (a rollback,
a restart, a fresh adapter) gets a fresh optimiser. One caller at a time: the worker process
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

from reef.grow.samples import Sample, TrainConfig  # plain data, torch-free; re-exported here

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# peft 0.21 asks transformers 5.23 a deprecated question when wrapping a model; harmless here
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
# one adapter per key plus temporary ones for log-probs: many adapters is the design, not a slip
warnings.filterwarnings("ignore", message="Already found a `peft_config` attribute", category=UserWarning)
warnings.filterwarnings("ignore", message=r"Adapter \S+ was active which is now deleted", category=UserWarning)


def warmed_up_lr(config: TrainConfig, steps_taken: int) -> float:
    """The learning rate of an optimiser's next step. A fresh AdamW's first updates are about
    lr in every direction, however noisy the gradient (its moment estimates are one sample
    old), so they ramp up over `warmup_steps`."""
    if config.warmup_steps <= 0:
        return config.lr
    return config.lr * min(1.0, (steps_taken + 1) / config.warmup_steps)


def adapter_part(files: dict[str, bytes] | None) -> dict[str, bytes] | None:
    """The peft adapter inside a release's content, at its root or in a sub-folder, as the
    embedded runtime finds it; None (the base model) when the content holds no adapter."""
    if not files:
        return None
    config = next((n for n in sorted(files) if n.rsplit("/", 1)[-1] == ADAPTER_CONFIG), None)
    if config is None:
        return None
    prefix = config[: -len(ADAPTER_CONFIG)]
    return {n[len(prefix):]: data for n, data in files.items() if n.startswith(prefix) and "/" not in n[len(prefix):]}


def adapter_hash(files: dict[str, bytes]) -> str:
    """Identity of an adapter's bytes, to tell whether a key's optimiser state was built on them."""
    digest = hashlib.sha256()
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        data = files.get(name, b"")
        digest.update(f"{name}:{len(data)}:".encode())
        digest.update(data)
    return digest.hexdigest()


@dataclass
class _Slot:
    """One key's adapter inside the shared peft model, and the optimiser that trains it."""

    name: str  # the peft adapter name (keys may hold characters module names cannot)
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.AdamW
    files_hash: str = ""
    steps: int = 0


class LoRATrainer:
    def __init__(self, model_dir: Path, threads: int | None = None) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if threads:
            torch.set_num_threads(threads)  # process-wide; the worker process owns its own pool
        self.model_dir = Path(model_dir)
        self.base: Any = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        self.base.requires_grad_(False)
        self.pad_id = int(self.base.config.pad_token_id or 0)  # any id will do: pads are masked out
        self.peft: Any = None  # the PeftModel wrapping `base`, made with the first adapter
        self._slots: dict[str, _Slot] = {}
        self._names = itertools.count(1)

    # -- the training step --------------------------------------------------------------------

    def step(self, key: str, adapter_files: dict[str, bytes] | None, samples: list[Sample],
             config: TrainConfig) -> tuple[dict[str, bytes], dict[str, float]]:
        """One AdamW step on `key`'s adapter with a token-level clipped policy-gradient loss.

        Tokens whose ratio lies outside (1 - eps_clip, 1 + eps_clip_high) are masked out (too
        far off-policy to trust); the loss is the mean over the rest of the batch. When every
        token is masked, no step is taken and the adapter comes back unchanged."""
        started = time.monotonic()
        _check(samples)
        slot = self._slot(key, adapter_part(adapter_files), config)
        rows = [s for s in samples if s.completion_ids]
        total = sum(len(s.completion_ids) for s in rows)
        with torch.random.fork_rng():  # LoRA dropout draws from a seeded generator, not the caller's
            torch.manual_seed(config.seed * 1_000_003 + slot.steps)
            self.peft.set_adapter(slot.name)
            self.peft.train()
            for group in slot.optimizer.param_groups:
                group["lr"], group["weight_decay"] = warmed_up_lr(config, slot.steps), config.weight_decay
            slot.optimizer.zero_grad(set_to_none=True)
            sums = dict(loss=0.0, ratio=0.0, kept=0.0, kl=0.0, max_log_ratio=0.0)
            try:
                for start in range(0, len(rows), max(1, config.micro_batch)):
                    self._accumulate(rows[start:start + max(1, config.micro_batch)], config, sums)
            finally:
                self.peft.eval()
        kept = int(sums["kept"])
        grad_norm = 0.0
        if kept:
            for p in slot.params:  # the losses were summed; the mean is over kept tokens of the whole batch
                if p.grad is not None:
                    p.grad.div_(kept)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(slot.params, config.max_grad_norm))
            if math.isfinite(grad_norm):
                slot.optimizer.step()
                slot.steps += 1
        slot.optimizer.zero_grad(set_to_none=True)
        files = self._save(slot.name)
        slot.files_hash = adapter_hash(files)
        metrics = {
            "loss": sums["loss"] / kept if kept else 0.0,
            "mean_ratio": sums["ratio"] / total if total else 1.0,
            "max_abs_log_ratio": sums["max_log_ratio"],
            "clipped_fraction": (total - kept) / total if total else 0.0,
            "kl": sums["kl"] / kept if kept else 0.0,
            "grad_norm": grad_norm,
            "tokens": float(total),
            "samples": float(len(samples)),
            "seconds": time.monotonic() - started,
        }
        return files, metrics

    def _accumulate(self, rows: list[Sample], config: TrainConfig, sums: dict[str, float]) -> None:
        """Forward and backward one micro-batch, adding the summed (not averaged) loss's grads."""
        seqs = [(s.prompt_ids, s.completion_ids) for s in rows]
        temps = [s.temperature for s in rows]
        base_lp = None
        if config.kl_coef > 0:
            with torch.no_grad(), self._base_only():
                base_lp, _ = self._completion_logprobs(seqs, temps)
        new_lp, mask = self._completion_logprobs(seqs, temps)
        old_lp = _right_aligned([s.rollout_logprobs for s in rows], new_lp.shape[1])
        advantage = torch.tensor([float(s.advantage) for s in rows]).unsqueeze(1)
        log_ratio = torch.where(mask, new_lp - old_lp, torch.zeros_like(new_lp))  # no exp() of pad garbage
        ratio = log_ratio.exp()
        r = ratio.detach()
        keep = mask & (r > 1 - config.eps_clip) & (r < 1 + config.eps_clip_high)
        clipped = torch.clamp(ratio, 1 - config.eps_clip, 1 + config.eps_clip_high)
        per_token = -torch.minimum(ratio * advantage, clipped * advantage)  # = -ratio*A where kept
        if base_lp is not None:
            d = torch.where(mask, base_lp - new_lp, torch.zeros_like(new_lp))
            k3 = d.exp() - d - 1
            per_token = per_token + config.kl_coef * k3
            sums["kl"] += float(torch.where(keep, k3.detach(), 0.0).sum())
        loss = torch.where(keep, per_token, torch.zeros_like(per_token)).sum()
        if bool(keep.any()):
            loss.backward()
        sums["loss"] += float(loss.detach())
        sums["ratio"] += float(torch.where(mask, r, 0.0).sum())
        sums["kept"] += float(keep.sum())
        sums["max_log_ratio"] = max(sums["max_log_ratio"], float(log_ratio.detach().abs().max()))

    # -- log-probs ----------------------------------------------------------------------------

    def logprobs(self, adapter_files: dict[str, bytes] | None, sequences: list[tuple[list[int], list[int]]],
                 temperature: float = 1.0) -> list[list[float]]:
        """Per-token log-probs of each completion given its prompt, under the base model (None)
        or an adapter: the gate's offline check, and the tests' on-policy check."""
        for prompt, _ in sequences:
            if not prompt:
                raise ValueError("every sequence needs a non-empty prompt")
        out: list[list[float]] = [[] for _ in sequences]
        todo = [i for i, (_, completion) in enumerate(sequences) if completion]
        with torch.no_grad(), self._adapter_only(adapter_part(adapter_files)):
            for start in range(0, len(todo), 8):
                chunk = todo[start:start + 8]
                lp, _ = self._completion_logprobs([sequences[i] for i in chunk], [temperature] * len(chunk))
                for row, i in enumerate(chunk):
                    n = len(sequences[i][1])
                    out[i] = lp[row, lp.shape[1] - n:].tolist()
        return out

    def _completion_logprobs(self, seqs: list[tuple[list[int], list[int]]],
                             temps: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs [B, C] of the completions, right-aligned (C = the longest completion), and the
        mask of real completion positions. Left padding and `cumsum(mask) - 1` positions, as in
        generation; logits only for the last C + 1 positions (the 49k vocabulary is the cost)."""
        width = max(len(p) + len(c) for p, c in seqs)
        longest = max(len(c) for _, c in seqs)
        ids = torch.tensor([[self.pad_id] * (width - len(p) - len(c)) + p + c for p, c in seqs])
        attention = torch.tensor([[0] * (width - len(p) - len(c)) + [1] * (len(p) + len(c)) for p, c in seqs])
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        logits = self.base(input_ids=ids, attention_mask=attention, position_ids=positions,
                           logits_to_keep=longest + 1).logits[:, :-1, :].float()
        scale = torch.tensor([t if t > 0 else 1.0 for t in temps], dtype=torch.float32).view(-1, 1, 1)
        logprobs = torch.log_softmax(logits / scale, dim=-1)
        targets = ids[:, width - longest:]
        picked = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        lengths = torch.tensor([len(c) for _, c in seqs]).unsqueeze(1)
        mask = torch.arange(longest).unsqueeze(0) >= (longest - lengths)
        return picked, mask

    # -- adapters -----------------------------------------------------------------------------

    def _slot(self, key: str, files: dict[str, bytes] | None, config: TrainConfig) -> _Slot:
        """`key`'s slot, reused only when `files` are exactly what its last step returned."""
        slot = self._slots.get(key)
        if slot is not None and files is not None and adapter_hash(files) == slot.files_hash:
            return slot
        name = self._add_adapter(files, config)
        if slot is not None:
            self.peft.delete_adapter(slot.name)
        self.peft.set_adapter(name)  # trainable: requires_grad on this adapter only
        params = [p for n, p in self.peft.named_parameters() if name in n.split(".")]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        slot = _Slot(name, params, optimizer, adapter_hash(files) if files is not None else "")
        self._slots[key] = slot
        return slot

    def _add_adapter(self, files: dict[str, bytes] | None, config: TrainConfig) -> str:
        """Inject a new adapter: fresh from `config` (B = 0, so it equals the base model) or with
        the weights and shape of `files` (their own LoRA config wins over `config`'s)."""
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
        from safetensors.torch import load as load_safetensors

        name = f"a{next(self._names)}"
        if files is None:
            lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                              target_modules=list(config.target_modules))
        else:
            if ADAPTER_CONFIG not in files or ADAPTER_WEIGHTS not in files:
                raise ValueError(f"adapter files need {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}, got {sorted(files)}")
            with tempfile.TemporaryDirectory(prefix="reef-train-") as folder:
                (Path(folder) / ADAPTER_CONFIG).write_bytes(files[ADAPTER_CONFIG])
                lora = LoraConfig.from_pretrained(folder)
            lora.inference_mode = False
        with torch.random.fork_rng():  # A's random init is seeded, and leaves the caller's RNG alone
            torch.manual_seed(config.seed)
            if self.peft is None:
                self.peft = get_peft_model(self.base, lora, adapter_name=name)
            else:
                self.peft.add_adapter(name, lora)
        if files is not None:
            try:
                result = set_peft_model_state_dict(self.peft, load_safetensors(files[ADAPTER_WEIGHTS]), adapter_name=name)
                missing = [k for k in result.missing_keys if f".{name}." in k]
                if result.unexpected_keys or missing:
                    raise ValueError(f"adapter weights do not fit: unexpected {result.unexpected_keys[:3]}, "
                                     f"missing {missing[:3]}")
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
        resident = next((s.name for s in self._slots.values() if s.files_hash == wanted), None)
        name = resident or self._add_adapter(files, TrainConfig())
        try:
            self.peft.set_adapter(name, inference_mode=resident is None)
            yield
        finally:
            if resident is None:
                self.peft.delete_adapter(name)


def _check(samples: list[Sample]) -> None:
    for i, s in enumerate(samples):
        if len(s.rollout_logprobs) != len(s.completion_ids):
            raise ValueError(f"sample {i}: {len(s.completion_ids)} completion tokens but "
                             f"{len(s.rollout_logprobs)} rollout log-probs")
        if not s.prompt_ids:
            raise ValueError(f"sample {i}: empty prompt")
        if not all(math.isfinite(x) for x in (s.advantage, *s.rollout_logprobs)):
            raise ValueError(f"sample {i}: advantage and log-probs must be finite")


def _right_aligned(rows: list[list[float]], width: int) -> torch.Tensor:
    return torch.tensor([[0.0] * (width - len(r)) + list(r) for r in rows], dtype=torch.float32)
