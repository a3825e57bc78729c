"""The trainer runs a prompt prefix its rows share once, its keys and values repeated to the
batch: log-probs, metrics and gradients are those of running every row whole."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

from reef.core.training import Datum, Rollout  # noqa: E402
from reef.grow.trainer import MIN_SHARED_PREFIX, LoRATrainer, TrainConfig  # noqa: E402
from tests.test_trainer import one_thread, pytestmark, weights  # noqa: E402,F401  (one_thread: autouse)

Seq = tuple[list[int], list[int]]


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 1000) for _ in range(n)]


def shared_rows(seed: int = 0, prefix: int = 40) -> list[Seq]:
    """Eight rows with one long common prefix, then suffixes and completions of other lengths."""
    rng = random.Random(seed)
    common = tokens(rng, prefix)
    return [(common + tokens(rng, 1 + 3 * i % 7), tokens(rng, 1 + i % 5)) for i in range(8)]


@pytest.fixture(scope="module")
def trainer(tiny_model_dir: Path) -> LoRATrainer:
    return LoRATrainer(tiny_model_dir)


def both(trainer: LoRATrainer, run: Callable[[], Any]) -> tuple[Any, Any]:
    """`run()` with the shared prefix (checking that it was used) and without it."""
    saved = trainer.shared_prefix_tokens
    shared = run()
    assert trainer.shared_prefix_tokens > saved
    trainer.min_shared_prefix = 0
    try:
        whole = run()
    finally:
        trainer.min_shared_prefix = MIN_SHARED_PREFIX
    return shared, whole


def assert_close(a: list[list[float]], b: list[list[float]], tol: float = 1e-5) -> None:
    assert [len(r) for r in a] == [len(r) for r in b]
    assert max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)) < tol


def samples(trainer: LoRATrainer, seqs: list[Seq]) -> list[Datum]:
    """On-policy samples (behaviour log-probs from the base) with advantages of both signs."""
    lps = trainer.logprobs(None, seqs)
    return [
        Rollout(f"r{i}", "base", p, c, lp).datum(1.0 if i % 2 else -1.0)
        for i, ((p, c), lp) in enumerate(zip(seqs, lps))
    ]


def test_logprobs_are_the_same_for_the_base_and_a_trained_adapter(trainer: LoRATrainer) -> None:
    seqs = shared_rows()
    assert_close(*both(trainer, lambda: trainer.logprobs(None, seqs)))
    files = None
    for _ in range(2):
        files, _ = trainer.step("trained", files, samples(trainer, seqs), TrainConfig(lr=5e-2))
    shared, whole = both(trainer, lambda: trainer.logprobs(files, seqs))
    assert_close(shared, whole)
    assert_close(*both(trainer, lambda: trainer.logprobs(files, seqs, 0.7)))
    assert max(abs(x - y) for a, b in zip(whole, trainer.logprobs(None, seqs)) for x, y in zip(a, b)) > 1e-3


def test_a_training_step_is_the_same(trainer: LoRATrainer) -> None:
    seqs = shared_rows(seed=1)
    data = samples(trainer, seqs)
    config = TrainConfig(lr=1e-3, kl_coef=0.1)  # the KL term runs the base over the prefix too

    start, _ = trainer.step("fb-start", None, samples(trainer, seqs[:2]), TrainConfig(lr=5e-2))  # B != 0

    def step(key: str) -> tuple[dict[str, float], list[torch.Tensor], dict[str, torch.Tensor]]:
        trainer.load_state(key, start, config.lora)  # the same adapter, AdamW state and dropout seed
        metrics = trainer.forward_backward(key, data, config.loss, config.loss_config)
        grads = [p.grad.clone() for p in trainer._slots[key].params]
        trainer.optim_step(key, config.adam)
        return metrics, grads, weights(trainer.save_state(key))

    (m1, g1, w1), (m2, g2, w2) = both(trainer, lambda: step(f"fb{trainer.min_shared_prefix}"))
    for name in ("loss", "clipped_fraction", "mean_ratio", "kl", "max_abs_log_ratio"):
        assert m1[name] == pytest.approx(m2[name], abs=1e-5), name
    scale = max(float(g.abs().max()) for g in g2)
    assert scale > 0 and max(float((a - b).abs().max()) for a, b in zip(g1, g2)) < 1e-4 * scale
    # AdamW moves every weight by about lr, whatever its gradient's size, so a weight whose
    # gradient is near zero turns float noise into a visible step: within 5% of one step's size
    # (1.2e-5 of lr 1e-3 was seen on one CPU)
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w2) < 0.05 * config.lr


def test_a_prompt_that_is_the_whole_prefix_keeps_its_last_token(trainer: LoRATrainer) -> None:
    rng = random.Random(2)
    common = tokens(rng, 30)
    seqs = [(common, tokens(rng, 3)), (common + tokens(rng, 4), tokens(rng, 2)), (common + [7], tokens(rng, 5))]
    saved = trainer.shared_prefix_tokens
    shared, whole = both(trainer, lambda: trainer.logprobs(None, seqs))
    assert trainer.shared_prefix_tokens - saved == 29 * 2  # one short of the prefix, saved on two rows
    assert_close(shared, whole)


def test_rows_without_a_long_common_prefix_run_whole(trainer: LoRATrainer) -> None:
    rng = random.Random(3)
    common = tokens(rng, 10)  # under MIN_SHARED_PREFIX
    saved = trainer.shared_prefix_tokens
    trainer.logprobs(None, [(tokens(rng, 30), tokens(rng, 3)) for _ in range(4)])  # nothing shared
    trainer.logprobs(None, [(common + tokens(rng, 20), tokens(rng, 3)) for _ in range(4)])
    trainer.logprobs(None, shared_rows()[:1])  # one row
    assert trainer.shared_prefix_tokens == saved
