"""What the trainer takes, as plain data: no torch here, so the learner, the recipes and the gate
import it on the core install (no `embedded` extra); `reef.grow.trainer` re-exports both."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    prompt_ids: list[int]          # the exact prompt the rollout continued
    completion_ids: list[int]      # generated tokens, EOS included when the model stopped
    rollout_logprobs: list[float]  # recorded log-prob per completion token
    advantage: float
    temperature: float = 1.0       # the temperature the rollout was sampled at (0 -> treat as 1)


@dataclass(frozen=True)
class TrainConfig:
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lr: float = 5e-4
    warmup_steps: int = 0          # a fresh optimiser's first steps ramp lr up linearly (0: none)
    weight_decay: float = 0.0
    eps_clip: float = 0.2          # tokens with ratio outside (1 - eps_clip, 1 + eps_clip_high) are masked out
    eps_clip_high: float = 0.28
    kl_coef: float = 0.0           # KL penalty to the base model (adapter disabled), k3 estimator per token
    max_grad_norm: float = 1.0
    micro_batch: int = 8
    seed: int = 0
