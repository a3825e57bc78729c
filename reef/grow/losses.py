"""The losses `forward_backward` knows, by name (see `reef.core.training.LOSSES`).

Each takes, per completion token of a micro-batch ([B, C], right-aligned): the log-probs under
the adapter being trained (`new`, with grad), the behaviour log-probs the tokens were sampled
with (`old`), the advantages, and `live` (a real token with a non-zero weight). It returns the
per-token loss and which tokens count (the mean is over those, across the whole call).
"""

from __future__ import annotations

from typing import Callable

import torch

from reef.core.training import DUAL_CLIP, LossConfig

Tensor = torch.Tensor
LossFn = Callable[[Tensor, Tensor, Tensor, Tensor, LossConfig], tuple[Tensor, Tensor]]


def log_ratio(new: Tensor, old: Tensor, live: Tensor) -> Tensor:
    return torch.where(live, new - old, torch.zeros_like(new))  # no exp() of pad garbage


def ppo(new: Tensor, old: Tensor, advantages: Tensor, live: Tensor, config: LossConfig) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate, -min(ratio * A, clip(ratio) * A), over every live token; for a
    negative advantage bounded below by DUAL_CLIP * A, so a token made far likelier since it was
    sampled cannot swamp the step."""
    ratio = log_ratio(new, old, live).exp()
    clipped = torch.clamp(ratio, 1 - config.eps_clip, 1 + config.eps_clip_high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    surrogate = torch.where(advantages < 0, torch.maximum(surrogate, DUAL_CLIP * advantages), surrogate)
    return -surrogate, live


def clipped_is(new: Tensor, old: Tensor, advantages: Tensor, live: Tensor, config: LossConfig) -> tuple[Tensor, Tensor]:
    """Tokens too far off-policy to trust (ratio outside the clip range) are masked out; on
    the rest this is -ratio * advantage."""
    ratio = log_ratio(new, old, live).exp()
    r = ratio.detach()
    keep = live & (r > 1 - config.eps_clip) & (r < 1 + config.eps_clip_high)
    clipped = torch.clamp(ratio, 1 - config.eps_clip, 1 + config.eps_clip_high)
    return -torch.minimum(ratio * advantages, clipped * advantages), keep


def cispo(new: Tensor, old: Tensor, advantages: Tensor, live: Tensor, config: LossConfig) -> tuple[Tensor, Tensor]:
    """CISPO: every live token's log-prob gradient, weighted by its importance ratio truncated at
    1 + eps_clip_high (no lower bound, as in the CISPO paper: a token the adapter now finds
    unlikely counts as little as it is likely). The clip bounds the weight instead of stopping
    the gradient: a token made likelier since it was sampled (the one being learned) still
    counts, as it does on-policy, where `ppo`'s clip drops it."""
    weight = torch.clamp(log_ratio(new, old, live).exp(), max=1 + config.eps_clip_high).detach()
    return -weight * new * advantages, live


def importance_sampling(
    new: Tensor, old: Tensor, advantages: Tensor, live: Tensor, config: LossConfig
) -> tuple[Tensor, Tensor]:
    return -log_ratio(new, old, live).exp() * advantages, live


def cross_entropy(
    new: Tensor, old: Tensor, advantages: Tensor, live: Tensor, config: LossConfig
) -> tuple[Tensor, Tensor]:
    return -new, live


LOSS_FUNCTIONS: dict[str, LossFn] = {
    "ppo": ppo,
    "clipped_is": clipped_is,
    "cispo": cispo,
    "importance_sampling": importance_sampling,
    "cross_entropy": cross_entropy,
}


def kl_to_base(new: Tensor, base: Tensor, live: Tensor) -> Tensor:
    """KL(adapter || base) per token, the k3 estimator (non-negative, low variance)."""
    d = torch.where(live, base - new, torch.zeros_like(new))
    return d.exp() - d - 1


def loss_function(name: str) -> LossFn:
    try:
        return LOSS_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known: {', '.join(LOSS_FUNCTIONS)}") from None
