"""The `sao` recipe trains with the loss its settings name: `cispo` by default, `ppo` or `clipped_is` on request,
`steps_per_candidate` optimiser steps of `batch_size` samples each; each sample's advantage is its score
minus the running baseline, or with `baseline: prompt` minus what its own prompt earned before."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from reef.core.training import Sample
from reef.recipes.sao import SAOBatch, SAOConfig, SAORecipe, ScoredSample


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
    items = [ScoredSample(f"r{i}", f"p{i}", i, float(i % 2), Sample([1, 2], [3, 4], [-0.5, -0.5], 0.0))
             for i in range(config.batch_size * config.steps_per_candidate)]
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


class RecordingTrainer(Trainer):
    """Keeps every datum's advantage, in the order the recipe trained them."""

    def __init__(self) -> None:
        super().__init__()
        self.advantages: list[float] = []

    async def forward_backward(self, data: Any, loss: str, config: Any) -> dict[str, float]:
        self.advantages += [datum.advantages[0] for datum in data]
        return await super().forward_backward(data, loss, config)


def scored(prompt: int, score: float, index: int) -> ScoredSample:
    return ScoredSample(f"r{index}", f"p{index}", index, score, Sample([prompt, 7], [3, 4], [-0.5, -0.5], 0.0))


def advantages_of(recipe: SAORecipe, items: list[ScoredSample], state: dict[str, Any]) -> tuple[list[float], dict]:
    trainer = RecordingTrainer()
    job = SimpleNamespace(trainer=trainer, start=None, algorithm_state=state)
    asyncio.run(recipe.candidate(SAOBatch(items), job))  # type: ignore[arg-type]
    return trainer.advantages, job.algorithm_state


def test_the_running_baseline_measures_every_score_against_one_average() -> None:
    recipe = SAORecipe(SAOConfig(batch_size=2, steps_per_candidate=1, baseline_decay=0.5))
    first, state = advantages_of(recipe, [scored(1, 1.0, 0), scored(2, 0.0, 1)], {})
    assert first == [0.5, -0.75] and state["baseline"] == 0.375  # starts at the batch's mean, then moves sample by sample
    second, _ = advantages_of(recipe, [scored(1, 1.0, 2), scored(1, 1.0, 3)], state)
    assert second == [0.625, 0.3125]  # prompt 1 is measured against everything, not its own history
    assert "prompt_baselines" not in recipe.status()


def test_a_prompt_asked_again_is_measured_against_what_it_earned_before() -> None:
    recipe = SAORecipe(SAOConfig(batch_size=2, steps_per_candidate=1, baseline_decay=0.5, baseline="prompt",
                                 prompt_baseline_decay=0.5))
    first, state = advantages_of(recipe, [scored(1, 1.0, 0), scored(2, 0.0, 1)], {})
    assert first == [0.5, -0.75]  # neither prompt seen before: the running baseline, as without the setting
    second, state = advantages_of(recipe, [scored(1, 1.0, 2), scored(2, 1.0, 3)], state)
    # prompt 1 earned 0.5 * 0.5 + 0.5 * 1.0 = 0.75 on average; prompt 2, 0.5 * 0.75 + 0.5 * 0.0 = 0.375
    assert second == [0.25, 0.625]
    third, _ = advantages_of(recipe, [scored(3, 0.0, 4), scored(1, 0.0, 5)], state)
    assert third[0] == -state["baseline"]  # a new prompt: the running baseline
    assert third[1] == -0.875  # prompt 1, after 1.0 again: 0.5 * 0.75 + 0.5 * 1.0
    assert recipe.status()["prompt_baselines"] == 3


def test_superseded_samples_scores_count_toward_their_prompts_average() -> None:
    recipe = SAORecipe(SAOConfig(batch_size=1, steps_per_candidate=1, baseline="prompt", prompt_baseline_decay=0.5))
    dropped: dict[str, int] = {}
    view = SimpleNamespace(drop=lambda reason, n=1: dropped.__setitem__(reason, dropped.get(reason, 0) + n))  # LearnerView's counter
    recipe.pending = [scored(1, 0.0, 0), scored(1, 0.0, 1), scored(1, 1.0, 2)]
    batch = asyncio.run(recipe.next_batch(view))  # type: ignore[arg-type]
    assert batch is not None and batch.record_ids == ["r2"] and dropped == {"superseded": 2}
    advantages, _ = advantages_of(recipe, batch.items, {"baseline": 0.8})
    # the two superseded 0s came first: 0.8 -> 0.4 -> 0.2, so the trained 1.0 is well above its prompt's average
    assert advantages == [0.8]


def test_the_prompt_averages_keep_the_newest_prompts_only(monkeypatch: Any) -> None:
    import reef.recipes.sao as sao

    monkeypatch.setattr(sao, "PROMPTS_KEPT", 2)
    recipe = SAORecipe(SAOConfig(batch_size=3, steps_per_candidate=1, baseline="prompt"))
    advantages_of(recipe, [scored(1, 1.0, 0), scored(2, 1.0, 1), scored(3, 1.0, 2)], {})
    assert recipe.status()["prompt_baselines"] == 2  # prompt 1, the least recent, was let go
