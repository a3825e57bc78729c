"""The settings every weights recipe shares: the LoRA adapter's shape, the optimiser, and which
samples may train (`learner.sao`, `learner.ttt_discover`, `learner.openclaw_rl` inherit them)."""

from __future__ import annotations

from pydantic import Field

from reef.config.strict import Strict
from reef.core.training import AdamParams, LoraShape


class WeightsTrainingConfig(Strict):
    """LoRA shape, optimiser and sample age, declared once for every weights recipe (a recipe may
    give one another default)."""

    lora_r: int = Field(16, ge=1, description="Rank of a fresh LoRA adapter (a checkpoint's own adapter config wins)")
    lora_alpha: int = Field(32, ge=1, description="LoRA scaling alpha of a fresh adapter")
    lr: float = Field(5e-4, gt=0, description="AdamW's learning rate")
    full_lr: float | None = Field(
        None, gt=0, description="AdamW's learning rate with learner.weights: full; unset: lr times 0.02"
    )
    kl_coef: float = Field(0.0, ge=0, description="Weight of the KL penalty to the base model")
    steps_per_candidate: int = Field(
        1,
        ge=1,
        description="Optimiser steps over a batch before the gate judges the "
        "adapter (fewer keep samples closer to the weights)",
    )
    max_staleness: int = Field(2, ge=0, description="Oldest release a sample may come from, in publications")

    @property
    def lora(self) -> LoraShape:
        return LoraShape(r=self.lora_r, alpha=self.lora_alpha)

    @property
    def adam(self) -> AdamParams:
        return AdamParams(lr=self.lr, full_lr=self.full_lr)


class ClippedLossConfig(WeightsTrainingConfig):
    """The importance ratio's clip range, for the recipes whose loss clips it."""

    eps_clip: float = Field(0.2, gt=0, lt=1, description="The ratio's lower bound is 1 - eps_clip")
    eps_clip_high: float = Field(
        0.28, gt=0, description="The ratio's upper bound (cispo: its weight's cap) is 1 + eps_clip_high"
    )
