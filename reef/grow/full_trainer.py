"""The training primitives on every weight of the model (`learner.weights: full`), on one rank or
as one of the N ranks of a `torch.distributed` job (`learner.ranks`, launched by torchrun:
`reef.grow.rank_main`).

The same calls as `reef.grow.trainer.LoRATrainer` (a recipe cannot tell them apart; the LoRA
shape is ignored), on a model of its own per key (scenario):

    load_state(key, checkpoint, lora)        start from a full-weight checkpoint, or from the base
    forward_backward(key, data, loss, cfg)   add the gradient of a named loss over `Datum`s
    optim_step(key, adam)                    one AdamW step (at `adam.lr_at(..., full=True)`)
    save_state(key)                          the checkpoint (`reef.grow.full_checkpoint`'s layout)
    logprobs(weights, sequences)             per-token log-probs under full weights or the base
    generate(weights, requests, max_tokens)  greedy answers under full weights or the base

On N > 1 ranks every model is FSDP2's (`fully_shard` on each decoder layer, then the root): each
rank holds 1/N of the weights, gradients and AdamW moments. Every rank runs every call in
lockstep, as the collectives need: `forward_backward` splits the rows between the ranks (round
robin, the same number of micro-batches on each: a rank out of rows runs one at weight 0), and
its sums are summed over the ranks; `logprobs` and `generate` run the whole batch on every rank
(rank 0's tokens decide, so all take the same steps); `save_state` gathers whole tensors and
only rank 0 writes the files. The base model the KL penalty and `logprobs(None)` use is a
frozen copy, sharded like the rest: 1/N of the base's memory on each rank, against a second
forward pass per batch to recompute base log-probs from anything else.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from reef.core.chat import ChatRequest
from reef.core.prefix import MIN_SHARED_PREFIX
from reef.core.training import (
    AdamParams,
    Datum,
    LoraShape,
    LossConfig,
    TrainConfig,
    checkpoint_part,
    full_weights_part,
    weights_kind,
)
from reef.grow.forward import SequenceModel, check_data, forward_backward_metrics, new_sums
from reef.grow.full_checkpoint import folder_files, optimizer_files, read_optimizer, read_weights, weights_files
from reef.grow.losses import loss_function
from reef.grow.trainer import files_hash, resolve_device, resolve_dtype

NO_SHARED_PREFIX = 1 << 30  # ranks train on different rows: a prefix run on one rank only would break lockstep


@dataclass
class _FullSlot:
    """One key's model and the optimiser that trains it."""

    model: Any
    names: list[str]  # its parameters' names, as checkpoints store them
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.AdamW
    steps: int = 0
    checkpoint_hash: str = ""  # of the checkpoint it was loaded from or last saved as; "" once it moved
    weights_hash: str = ""


class FullTrainer(SequenceModel):
    def __init__(
        self,
        model_dir: Path,
        threads: int | None = None,
        device: str = "auto",
        dtype: str = "auto",
        engine_dtype: str | None = None,
        min_shared_prefix: int = MIN_SHARED_PREFIX,
    ) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if threads:
            torch.set_num_threads(threads)
        self.ranks = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        on = torch.device(resolve_device(device))
        if on.type == "cuda" and self.ranks > 1:
            on = torch.device("cuda", torch.cuda.current_device())  # rank_main chose this rank's GPU
        self.dtype = resolve_dtype(dtype, on.type, engine_dtype)
        super().__init__(Path(model_dir), 0, on, min_shared_prefix)
        self.extra_files = folder_files(self.model_dir)
        self.base: Any = self._model(None, trainable=False)
        self.pad_id = int(self.base.config.pad_token_id or 0)  # any id will do: pads are masked out
        self.layers = int(self.base.config.num_hidden_layers)
        self._slots: dict[str, _FullSlot] = {}
        self._scratch: tuple[str, Any] | None = None  # other weights `logprobs`/`generate` were asked for

    # -- the primitives -------------------------------------------------------------------------

    def load_state(self, key: str, checkpoint: dict[str, bytes] | None, lora: LoraShape) -> dict[str, float]:
        """Make `key` train from `checkpoint` (a full-weight release's content, or None: the
        base), its optimiser restored when the checkpoint carries one. The checkpoint `key` last
        loaded or saved keeps its resident state (the same numbers)."""
        checkpoint = checkpoint_part(checkpoint)
        if checkpoint is not None and weights_kind(checkpoint) != "full":
            raise ValueError("learner.weights is full but the checkpoint holds a LoRA adapter; train from the base")
        wanted = files_hash(checkpoint) if checkpoint is not None else ""
        slot = self._slots.get(key)
        if slot is not None and wanted and wanted == slot.checkpoint_hash:
            return {"steps": float(slot.steps), "resumed": 1.0}
        if slot is not None:
            del self._slots[key]
            del slot
            gc.collect()
        model = self._model(checkpoint, trainable=True)
        named = list(model.named_parameters())
        params = [p for _, p in named]
        slot = _FullSlot(model, [n for n, _ in named], params, torch.optim.AdamW(params))
        slot.steps = self._restore_optimizer(slot, checkpoint or {})
        slot.checkpoint_hash = wanted
        slot.weights_hash = _weights_hash(checkpoint) if checkpoint is not None else ""
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
        mine = rows[self.rank :: self.ranks]
        size = max(1, config.micro_batch)
        batches = math.ceil(math.ceil(len(rows) / self.ranks) / size)  # the same count on every rank
        sums = new_sums()
        model = slot.model

        def trained(seqs: Any, temps: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
            return self._completion_logprobs(model, seqs, temps, self._training_prefix())

        def base(seqs: Any, temps: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
            return self._completion_logprobs(self.base, seqs, temps, self._training_prefix())

        together = self.ranks > 1
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(1_000_003 + slot.steps)  # dropout, where a model has any, is seeded
            model.train()
            try:
                for b in range(batches):
                    chunk = mine[b * size : (b + 1) * size]
                    weight = 1.0 if chunk else 0.0
                    self._accumulate(chunk or rows[:1], loss, loss_fn, config, sums, trained, base, weight, together)
            finally:
                model.eval()
        sums = self._summed(sums)
        kept = int(sums["kept"])
        for p, before in zip(slot.params, earlier):
            if p.grad is not None and kept:
                # the losses were summed; the mean is over this call's kept tokens on all ranks,
                # and FSDP's reduce-scatter averaged the ranks' sums
                p.grad.mul_(self.ranks / kept)
            if before is not None:
                p.grad = before if p.grad is None else p.grad + before
        total = sum(len(d.completion_ids) for d in rows)
        return forward_backward_metrics(sums, total, len(data), started)

    def optim_step(self, key: str, adam: AdamParams) -> dict[str, float]:
        """One AdamW step on the accumulated gradient (clipped to `max_grad_norm`), then clear
        it. Without a gradient (every token masked) or with a non-finite one, no step is taken."""
        slot = self._slot(key)
        grad_norm = 0.0
        if any(p.grad is not None for p in slot.params):
            norm = torch.nn.utils.clip_grad_norm_(slot.params, adam.max_grad_norm)
            grad_norm = float(_whole(norm))
            if math.isfinite(grad_norm):
                for group in slot.optimizer.param_groups:
                    group["lr"], group["weight_decay"] = adam.lr_at(slot.steps, full=True), adam.weight_decay
                slot.optimizer.step()
                slot.steps += 1
                slot.checkpoint_hash = slot.weights_hash = ""
        slot.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "steps": float(slot.steps)}

    def save_state(self, key: str) -> dict[str, bytes]:
        """`key`'s checkpoint: its weights and its optimiser's state (on rank 0; the other ranks
        take part in the gather and return nothing)."""
        slot = self._slot(key)
        tensors: dict[str, torch.Tensor] = {}
        moments: dict[str, dict[str, torch.Tensor]] = {}
        for name, param in zip(slot.names, slot.params):
            tensors[name] = _gathered(param.detach())
            state = slot.optimizer.state.get(param, {})
            entry = {m: _gathered(v.detach()) for m, v in sorted(state.items()) if isinstance(v, torch.Tensor)}
            if entry:
                moments[name] = entry
        files: dict[str, bytes] = {}
        hashes = ["", ""]
        if self.rank == 0:
            files = {
                **weights_files(tensors, self.layers, self.extra_files),
                **optimizer_files(moments, self.layers, slot.steps, self.ranks),
            }
            hashes = [files_hash(files), _weights_hash(files)]
        if self.ranks > 1:
            dist.broadcast_object_list(hashes, src=0)  # every rank knows the checkpoint it holds
        slot.checkpoint_hash, slot.weights_hash = hashes
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

    def logprobs(
        self,
        weights: dict[str, bytes] | None,
        sequences: list[tuple[list[int], list[int]]],
        temperature: float = 1.0,
    ) -> list[list[float]]:
        """Per-token log-probs of each completion given its prompt, under the base model (None)
        or full weights (a release's content)."""
        return self._sequence_logprobs(self._serving(weights), sequences, temperature)

    def generate(self, weights: dict[str, bytes] | None, requests: list[ChatRequest], max_tokens: int) -> list[str]:
        """Each request's greedy answer under the base model (None) or full weights."""
        return self._answers(self._serving(weights), requests, max_tokens, self._agree if self.ranks > 1 else None)

    # -- models ---------------------------------------------------------------------------------

    def _model(self, checkpoint: dict[str, bytes] | None, trainable: bool) -> Any:
        """The base model, with a checkpoint's weights when one is given, on this rank's device
        and, on N ranks, sharded."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=self.dtype)
        if checkpoint is not None:
            _load_weights(model, read_weights(checkpoint))
        model.to(self.device).eval()
        model.requires_grad_(trainable)
        if self.ranks > 1:
            from torch.distributed.fsdp import fully_shard

            for layer in [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]:
                fully_shard(layer)
            fully_shard(model)
        return model

    def _serving(self, files: dict[str, bytes] | None) -> Any:
        """The model holding `files`' weights: the base (None), a key's resident model when the
        bytes match, else a scratch model loaded with them (kept for the next call)."""
        if files is None or weights_kind(files) is None:
            return self.base
        weights = full_weights_part(files)
        if weights is None:
            raise ValueError("learner.weights is full: it scores full-weight releases or the base, not a LoRA adapter")
        wanted = _weights_hash(weights)
        for slot in self._slots.values():
            if slot.weights_hash == wanted:
                return slot.model
        if self._scratch is None or self._scratch[0] != wanted:
            self._scratch = None
            gc.collect()
            self._scratch = (wanted, self._model(weights, trainable=False))
        return self._scratch[1]

    def _restore_optimizer(self, slot: _FullSlot, files: dict[str, bytes]) -> int:
        steps, moments = read_optimizer(files)
        if not moments:
            return steps
        unknown = set(moments) - set(slot.names)
        if unknown:
            raise ValueError(f"optimiser state for parameters the model lacks: {sorted(unknown)[:3]}")
        state: dict[int, dict[str, Any]] = {}
        for index, (name, param) in enumerate(zip(slot.names, slot.params)):
            if name in moments:
                state[index] = {m: _like(param, v) if m != "step" else v for m, v in moments[name].items()}
        saved = slot.optimizer.state_dict()
        slot.optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
        return steps

    def _slot(self, key: str) -> _FullSlot:
        slot = self._slots.get(key)
        if slot is None:
            raise ValueError(f"no training state for {key!r}: load_state it first")
        return slot

    # -- ranks ----------------------------------------------------------------------------------

    def _training_prefix(self) -> int | None:
        return NO_SHARED_PREFIX if self.ranks > 1 else None

    def _summed(self, sums: dict[str, float]) -> dict[str, float]:
        if self.ranks == 1:
            return sums
        names = [n for n in sums if n != "max_log_ratio"]
        summed = torch.tensor([sums[n] for n in names], dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        largest = torch.tensor([sums["max_log_ratio"]], dtype=torch.float64, device=self.device)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        return {**dict(zip(names, summed.tolist())), "max_log_ratio": float(largest)}

    def _agree(self, chosen: torch.Tensor) -> torch.Tensor:
        dist.broadcast(chosen, src=0)
        return chosen


def _weights_hash(files: dict[str, bytes]) -> str:
    return files_hash(full_weights_part(files) or {})


def _load_weights(model: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Put a checkpoint's weights into an unsharded model: every parameter must be there (a tied
    head once), and nothing else."""
    names = {n for n, _ in model.named_parameters()}
    missing, unexpected = sorted(names - set(tensors)), sorted(set(tensors) - names)
    if missing or unexpected:
        raise ValueError(
            f"the checkpoint's weights do not fit the base model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(tensors[name])


def _gathered(tensor: torch.Tensor) -> torch.Tensor:
    """A whole tensor on the CPU (a sharded one is gathered: every rank must call this alike)."""
    return _whole(tensor).cpu().clone()


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`value` (a whole tensor) laid out as `param` is: this rank's shard of it on N ranks."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    value = value.to(device=param.device, dtype=param.dtype)
    if isinstance(param, DTensor):
        return distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
    return value


__all__ = ["FullTrainer"]
