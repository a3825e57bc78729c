"""The `sao` recipe trains with the loss its settings name: `cispo` by default, `ppo` or `clipped_is` on request,
`steps_per_candidate` optimiser steps of `batch_size` samples each."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from reef.core.training import Rollout
from reef.grow.rollouts import ScoredRollout
from reef.recipes.sao import SAOBatch, SAOConfig, SAORecipe


class Trainer:
    def __init__(self) -> None:
        self.losses: list[str] = []
        self.steps = 0

    async def load_state(self, checkpoint: Any, lora: Any = None) -> dict[str, float]:
        return {}

    async def forward_backward(self, data: Any, loss: str, config: Any) -> dict[str, float]:
        self.losses.append(loss)
        return {"loss": 0.0}

    async def optim_step(self, adam: Any) -> dict[str, float]:
        self.steps += 1
        return {}

    async def save_state(self) -> dict[str, bytes]:
        return {"adapter_config.json": b"{}"}


def train(config: SAOConfig) -> Trainer:
    items = [
        ScoredRollout(f"p{i}", i, float(i % 2), Rollout(f"r{i}", "rel", [1, 2], [3, 4], [-0.5, -0.5]))
        for i in range(config.batch_size * config.steps_per_candidate)
    ]
    trainer = Trainer()
    job = SimpleNamespace(trainer=trainer, start=None, algorithm_state={})
    asyncio.run(SAORecipe(config).candidate(SAOBatch(items), job))  # type: ignore[arg-type]
    return trainer


def test_sao_trains_with_cispo_by_default_and_the_others_when_asked() -> None:
    default = train(SAOConfig(batch_size=2))
    assert default.losses == ["cispo", "cispo"] and default.steps == 2  # steps_per_candidate defaults to 2
    masked = train(SAOConfig(batch_size=2, steps_per_candidate=3, loss="clipped_is"))
    assert masked.losses == ["clipped_is"] * 3 and masked.steps == 3
    surrogate = train(SAOConfig(batch_size=2, steps_per_candidate=1, loss="ppo"))
    assert surrogate.losses == ["ppo"] and surrogate.steps == 1
