"""The training primitives on the tiny model: the optimiser survives a restart of the training
process (two steps, restart, one more == three straight), losses are chosen by name, advantages
and the loss mask are per token, and a call without trainable tokens takes no step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load as load_safetensors  # noqa: E402

from reef.core.training import AdamParams, Datum, LoraShape, LossConfig  # noqa: E402
from reef.grow.trainer import LoRATrainer  # noqa: E402
from reef.grow.training_client import TrainingClient  # noqa: E402
from reef.grow.worker import TrainingFailed, TrainingWorker  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:Adapter .* was active which is now deleted:UserWarning"),
    pytest.mark.filterwarnings("ignore:Already found a `peft_config` attribute:UserWarning"),
]
PROMPT = [1, 4093, 198, 19556, 314, 216, 33, 30, 2, 198, 1, 520, 9531, 198]  # any ids the tiny model knows
COMPLETIONS = [[300 + i, 301, 302 + i, 2] for i in range(6)]
ADAM = AdamParams(lr=1e-2)


def tensors(files: dict[str, bytes], name: str) -> dict[str, Any]:
    return load_safetensors(files[name])


def same(a: dict[str, bytes], b: dict[str, bytes]) -> bool:
    """Bit-identical adapters and optimiser moments (and step counts)."""
    return (
        all(
            torch.equal(x, tensors(b, name)[k])
            for name in ("adapter_model.safetensors", "training/optimizer.safetensors")
            for k, x in tensors(a, name).items()
        )
        and a["training/state.json"] == b["training/state.json"]
    )


async def on_policy(client: TrainingClient) -> list[Datum]:
    """Data whose behaviour log-probs are the base model's own, advantages alternating in sign."""
    seqs = [(PROMPT, c) for c in COMPLETIONS]
    logprobs = await client.logprobs(seqs)
    return [
        Datum(PROMPT, c, lp, [(-1.0) ** i] * len(c), [1.0] * len(c))
        for i, (c, lp) in enumerate(zip(COMPLETIONS, logprobs))
    ]


async def train(client: TrainingClient, data: list[Datum], steps: int) -> dict[str, bytes]:
    for _ in range(steps):
        await client.forward_backward(data, "clipped_is", LossConfig(kl_coef=0.1))
        await client.optim_step(ADAM)
    return await client.save_state()


def test_the_optimiser_survives_a_restart_of_the_training_process(tiny_model_dir: Path) -> None:
    async def main() -> None:
        worker = TrainingWorker(tiny_model_dir, threads=1)
        await worker.start()
        try:
            straight = TrainingClient(worker, "straight")
            data = await on_policy(straight)
            await straight.load_state(None, LoraShape(seed=3))
            three = await train(straight, data, 3)

            interrupted = TrainingClient(worker, "interrupted")
            await interrupted.load_state(None, LoraShape(seed=3))
            two = await train(interrupted, data, 2)
            first_pid = worker.pid
            await worker.close()
            await worker.start()  # a new training process: nothing resident
            assert worker.pid != first_pid
            assert (await interrupted.load_state(two)) == {"steps": 2.0, "resumed": 0.0}
            resumed = await train(interrupted, data, 1)
            assert same(resumed, three)

            cold = TrainingClient(worker, "cold")  # the same adapter without its optimiser: not the same
            await cold.load_state({k: v for k, v in two.items() if not k.startswith("training/")})
            assert not same(await train(cold, data, 1), three)
            with pytest.raises(TrainingFailed, match="load_state it first"):
                await TrainingClient(worker, "never-loaded").optim_step(ADAM)
        finally:
            await worker.close()

    asyncio.run(main())


@pytest.fixture(scope="module")
def trainer(tiny_model_dir: Path) -> Iterator[LoRATrainer]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LoRATrainer(tiny_model_dir)
    torch.set_num_threads(before)


def mean_logprob(
    trainer: LoRATrainer, files: dict[str, bytes] | None, completion: list[int], upto: int | None = None
) -> float:
    lp = trainer.logprobs(files, [(PROMPT, completion)])[0][:upto]
    return sum(lp) / len(lp)


def test_losses_by_name_with_per_token_advantages_and_mask(trainer: LoRATrainer) -> None:
    target = COMPLETIONS[0]
    base = trainer.logprobs(None, [(PROMPT, target)])[0]
    # cross-entropy needs no behaviour log-probs and raises the target's likelihood
    trainer.load_state("ce", None, LoraShape())
    trainer.forward_backward("ce", [Datum(PROMPT, target, [], [0.0] * 4, [1.0] * 4)], "cross_entropy", LossConfig())
    trainer.optim_step("ce", ADAM)
    assert mean_logprob(trainer, trainer.save_state("ce"), target) > sum(base) / 4

    # per-token advantages: the first two tokens pushed up, the last two down
    trainer.load_state("split", None, LoraShape())
    metrics = trainer.forward_backward(
        "split", [Datum(PROMPT, target, base, [1.0, 1.0, -1.0, -1.0], [1.0] * 4)], "importance_sampling", LossConfig()
    )
    assert metrics["tokens"] == 4 and metrics["clipped_fraction"] == 0.0
    trainer.optim_step("split", AdamParams(lr=5e-2))
    after = trainer.logprobs(trainer.save_state("split"), [(PROMPT, target)])[0]
    assert after[0] + after[1] > base[0] + base[1] and after[2] + after[3] < base[2] + base[3], (base, after)

    # far off-policy: clipped_is masks every token, importance_sampling keeps them
    stale = Datum(PROMPT, target, [x + 3.0 for x in base], [1.0] * 4, [1.0] * 4)
    trainer.load_state("off", None, LoraShape())
    assert trainer.forward_backward("off", [stale], "clipped_is", LossConfig())["clipped_fraction"] == 1.0
    assert trainer.optim_step("off", ADAM) == {"grad_norm": 0.0, "steps": 0.0}  # no gradient: no step
    assert trainer.forward_backward("off", [stale], "importance_sampling", LossConfig())["clipped_fraction"] == 0.0
    assert trainer.optim_step("off", ADAM)["steps"] == 1.0

    # ppo: the stale tokens count; made unlikelier since sampled, a positive advantage pulls them back up
    trainer.load_state("ppo", None, LoraShape())
    metrics = trainer.forward_backward("ppo", [stale], "ppo", LossConfig())
    assert metrics["clipped_fraction"] == 0.0 and metrics["outside_clip_fraction"] == 1.0, metrics
    trainer.optim_step("ppo", ADAM)
    assert mean_logprob(trainer, trainer.save_state("ppo"), target) > sum(base) / 4
    # ... while one already made likelier than the clip allows adds no gradient
    ahead = Datum(PROMPT, target, [x - 3.0 for x in base], [1.0] * 4, [1.0] * 4)
    trainer.load_state("ahead", None, LoraShape())
    trainer.forward_backward("ahead", [ahead], "ppo", LossConfig())
    assert trainer.optim_step("ahead", ADAM)["grad_norm"] == 0.0
    # cispo: that token still learns, its weight bounded by the clip (1 + eps_clip_high), not stopped
    trainer.load_state("cispo", None, LoraShape())
    metrics = trainer.forward_backward("cispo", [ahead], "cispo", LossConfig())
    assert metrics["clipped_fraction"] == 0.0 and metrics["outside_clip_fraction"] == 1.0, metrics
    assert metrics["loss"] == pytest.approx(-1.28 * sum(base) / 4, rel=1e-4)  # -(clipped weight) x log p x A
    trainer.optim_step("cispo", ADAM)
    assert mean_logprob(trainer, trainer.save_state("cispo"), target) > sum(base) / 4

    # a zero mask weight trains nothing; an unknown loss is refused with the known ones
    trainer.load_state("masked", None, LoraShape())
    masked = Datum(PROMPT, target, base, [1.0] * 4, [0.0] * 4)
    assert trainer.forward_backward("masked", [masked], "clipped_is", LossConfig())["clipped_fraction"] == 1.0
    assert trainer.optim_step("masked", ADAM)["steps"] == 0.0
    with pytest.raises(ValueError, match="known: ppo, clipped_is, cispo, importance_sampling, cross_entropy"):
        trainer.forward_backward("masked", [masked], "dpo", LossConfig())
    with pytest.raises(ValueError, match="datum 0: 4 completion tokens but 3 advantages"):
        trainer.forward_backward(
            "masked", [Datum(PROMPT, target, base, [1.0] * 3, [1.0] * 4)], "clipped_is", LossConfig()
        )


def test_two_calls_before_a_step_add_their_gradients(trainer: LoRATrainer) -> None:
    base = trainer.logprobs(None, [(PROMPT, c) for c in COMPLETIONS[:2]])
    up = [Datum(PROMPT, c, lp, [1.0] * 4, [1.0] * 4) for c, lp in zip(COMPLETIONS[:2], base)]
    trainer.load_state("once", None, LoraShape())
    trainer.forward_backward("once", up, "clipped_is", LossConfig())
    once = trainer.optim_step("once", AdamParams(lr=0.0))["grad_norm"]
    trainer.load_state("twice", None, LoraShape())
    trainer.forward_backward("twice", up, "clipped_is", LossConfig())
    trainer.forward_backward("twice", up, "clipped_is", LossConfig())  # the same mean again: twice the gradient
    assert once > 0 and trainer.optim_step("twice", AdamParams(lr=0.0))["grad_norm"] == pytest.approx(
        2 * once, rel=1e-4
    )
