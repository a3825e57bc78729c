"""What a recipe hands the training primitives, as plain data (no torch: the parent process
builds these and the training process reads them).

A `Datum` is one sequence to learn from: the prompt it continued, the completion, the
log-probs the completion was sampled with (the behaviour policy), and per completion token an
advantage and a loss weight (0 masks the token out). A loss is chosen by name (`LOSSES`);
`LossConfig` holds its knobs, `AdamParams` those of the optimiser step, `LoraShape` the shape
of a fresh adapter. A `Rollout` is a served completion as recipes keep it until it becomes a `Datum`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

# ppo: PPO's clipped surrogate against the behaviour log-probs (SAO's loss): every token counts; one
#   whose ratio already left (1 - eps_clip, 1 + eps_clip_high) the way its advantage pushes adds
#   no gradient, one that left the other way is pulled back (a negative advantage's pull at most
#   DUAL_CLIP times the advantage: dual-clip PPO).
# clipped_is: policy gradient with importance ratios; tokens whose ratio lies outside the clip
#   range are masked out altogether (for behaviour log-probs that cannot be trusted far off).
# cispo: every token's log-prob gradient times its ratio truncated at 1 + eps_clip_high (the weight
#   is bounded, no token is dropped: one made likelier since it was sampled still learns).
# importance_sampling: the same without clipping or masking.
# cross_entropy: supervised: -log p of each weighted completion token (distillation targets).
LOSSES = ("ppo", "clipped_is", "cispo", "importance_sampling", "cross_entropy")
DUAL_CLIP = 3.0
TRAINING_FOLDER = "training/"  # where a checkpoint keeps the optimiser beside its adapter


@dataclass(frozen=True)
class Datum:
    prompt_ids: list[int]  # the exact prompt the completion continued
    completion_ids: list[int]  # the tokens learned from, EOS included when the model stopped
    behaviour_logprobs: list[float]  # per completion token, as sampled (may be empty for cross_entropy)
    advantages: list[float]  # per completion token
    mask: list[float]  # per completion token: its weight in the loss (0: not trained on)
    temperature: float = 1.0  # the temperature it was sampled at (0 counts as 1)

    def check(self, loss: str) -> None:
        n = len(self.completion_ids)
        if not self.prompt_ids:
            raise ValueError("empty prompt")
        if len(self.advantages) != n or len(self.mask) != n:
            raise ValueError(
                f"{n} completion tokens but {len(self.advantages)} advantages and {len(self.mask)} mask weights"
            )
        if loss != "cross_entropy" and len(self.behaviour_logprobs) != n:
            raise ValueError(f"{n} completion tokens but {len(self.behaviour_logprobs)} rollout log-probs")
        if not all(math.isfinite(x) for x in (*self.advantages, *self.mask, *self.behaviour_logprobs)):
            raise ValueError("advantages, mask weights and log-probs must be finite")


@dataclass(frozen=True)
class Rollout:
    """One served completion as the learner trains on it, made once from its record
    (`reef.grow.rollouts.rollout_of`). Recipes keep it beside their own score, report or group
    slot, and it becomes a training row only when they train: `datum(advantage)`."""

    record_id: str
    release_id: str  # the release that sampled it (the behaviour policy)
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]  # per completion token, as sampled
    temperature: float = 1.0  # the temperature it was sampled at (0 counts as 1)

    def datum(self, advantage: float | Sequence[float]) -> Datum:
        """The training row: one advantage for every token, or one per token; every token weighs 1."""
        n = len(self.completion_ids)
        advantages = [float(advantage)] * n if isinstance(advantage, (int, float)) else list(advantage)
        return Datum(
            self.prompt_ids, self.completion_ids, self.behaviour_logprobs, advantages, [1.0] * n, self.temperature
        )


@dataclass(frozen=True)
class LossConfig:
    eps_clip: float = 0.2  # ppo, clipped_is: the ratio's lower bound is 1 - eps_clip
    eps_clip_high: float = 0.28  # ppo, clipped_is: its upper bound is 1 + eps_clip_high (cispo: the weight's cap)
    kl_coef: float = 0.0  # any loss: a KL penalty to the base model (adapter off), k3 estimator per token
    micro_batch: int = 8  # sequences per forward pass (memory, not maths)


# Full weights move every weight of the model where LoRA moves a low-rank correction: the same
# AdamW step size would wreck them. Without its own `full_lr` a recipe's lr is scaled by this
# (5e-4, LoRA's default, becomes 1e-5, a usual full fine-tuning rate).
FULL_LR_SCALE = 0.02


@dataclass(frozen=True)
class AdamParams:
    lr: float = 5e-4
    warmup_steps: int = 0  # the optimiser's first steps ramp lr up linearly (0: none)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    full_lr: float | None = None  # the rate when training full weights (None: lr * FULL_LR_SCALE)

    def lr_at(self, steps_taken: int, full: bool = False) -> float:
        """The learning rate of the next step (of full weights: `full_lr`). A fresh AdamW's
        first updates are about lr in every direction, however noisy the gradient (its moments
        are one sample old), so they ramp up over `warmup_steps`."""
        lr = self.lr if not full else self.full_lr if self.full_lr is not None else self.lr * FULL_LR_SCALE
        if self.warmup_steps <= 0:
            return lr
        return lr * min(1.0, (steps_taken + 1) / self.warmup_steps)


@dataclass(frozen=True)
class LoraShape:
    """A fresh adapter's shape; a checkpoint's own adapter config wins over it."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    seed: int = 0  # seeds A's initialisation and dropout


@dataclass(frozen=True)
class TrainConfig:
    """One SAO-style optimiser step's settings: the adapter's shape, the loss's and AdamW's."""

    lora: LoraShape = field(default_factory=LoraShape)
    lr: float = 5e-4
    warmup_steps: int = 0
    weight_decay: float = 0.0
    eps_clip: float = 0.2
    eps_clip_high: float = 0.28
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch: int = 8
    loss: str = field(default="clipped_is")

    @property
    def loss_config(self) -> LossConfig:
        return LossConfig(self.eps_clip, self.eps_clip_high, self.kl_coef, self.micro_batch)

    @property
    def adam(self) -> AdamParams:
        return AdamParams(self.lr, self.warmup_steps, self.weight_decay, self.max_grad_norm)


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def adapter_part(files: Mapping[str, bytes] | None) -> dict[str, bytes] | None:
    """The peft adapter inside a release's content, at its root or in a sub-folder, as the
    embedded runtime finds it; None (the base model) when the content holds no adapter."""
    if not files:
        return None
    config = next(
        (
            n
            for n in sorted(files)
            if n.rsplit("/", 1)[-1] == ADAPTER_CONFIG and not n.startswith(("harness/", TRAINING_FOLDER))
        ),
        None,
    )
    if config is None:
        return None
    prefix = config[: -len(ADAPTER_CONFIG)]
    return {n[len(prefix) :]: data for n, data in files.items() if n.startswith(prefix) and "/" not in n[len(prefix) :]}


def checkpoint_part(files: Mapping[str, bytes] | None) -> dict[str, bytes] | None:
    """What training continues from in a release's content: its weights (an adapter, or full
    weights) and the optimiser state beside them (`training/`); None when it holds neither
    (train from the base)."""
    weights = weights_part(files)
    if weights is None or files is None:
        return None
    return {**weights, **{n: d for n, d in files.items() if n.startswith(TRAINING_FOLDER)}}


def weights_part(files: Mapping[str, bytes] | None) -> dict[str, bytes] | None:
    """The weights a release serves, of either kind: its full weights, else its adapter; None:
    the base model's (what the trainer's `logprobs` and `generate` take)."""
    return full_weights_part(files) or adapter_part(files)


FULL_CONFIG = "config.json"
FULL_INDEX = "model.safetensors.index.json"
FULL_SINGLE = "model.safetensors"


def weights_kind(files: Mapping[str, bytes] | None) -> str | None:
    """What weights a release's content carries: "full" (a Hugging Face checkpoint at its root:
    `config.json` with `model.safetensors` or its shard index), "lora" (a peft adapter) or None."""
    if files and FULL_CONFIG in files and (FULL_INDEX in files or FULL_SINGLE in files):
        return "full"
    return "lora" if adapter_part(files) is not None else None


def full_weights_part(files: Mapping[str, bytes] | None) -> dict[str, bytes] | None:
    """The servable half of a full-weight release: every root-level file (config, shards, index,
    tokenizer), never `training/` (the optimiser) nor `harness/`; None when it holds no full weights."""
    if weights_kind(files) != "full" or files is None:
        return None
    return {n: d for n, d in files.items() if "/" not in n}
