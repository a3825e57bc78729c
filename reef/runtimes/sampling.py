"""Sampling one token from logits, reporting the log-prob of the distribution the token was
actually drawn from (after temperature and top-p), which is what the trainer's importance ratio
needs. The embedded runtime's only torch-dependent helper, kept apart from `chatml` so the
engine runtimes do not import torch.
"""

from __future__ import annotations

import torch


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> tuple[int, float]:
    """One token and its log-prob under the distribution it was drawn from (temperature and
    nucleus applied). Greedy has a point mass there, which says nothing; it records the model's
    own (temperature 1) log-prob instead."""
    scaled = logits / temperature if temperature > 0 else logits
    if temperature <= 0 or not bool(torch.isfinite(scaled.max())):  # a temperature so small it overflows is greedy
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, -1)[token])
    if top_p < 1.0:
        scaled = _nucleus(scaled, top_p)
    logprobs = torch.log_softmax(scaled, -1)
    token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
    return token, float(logprobs[token])


def _nucleus(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(scaled, descending=True)
    probs = torch.softmax(sorted_logits, -1)
    drop = (torch.cumsum(probs, -1) - probs) >= top_p  # mass above each token already covers p
    drop[0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(0, order, sorted_logits)
