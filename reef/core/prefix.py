"""The leading tokens a batch of prompts shares, which a forward pass can run once for all rows.

Both the embedded runtime (prefill) and the trainer (forward and backward) use it: prompts of one
batch usually start alike (a system prompt, an agent's instructions, the same worked example),
and those tokens are most of the work.
"""

from __future__ import annotations

from typing import Sequence

MIN_SHARED_PREFIX = 16  # fewer shared tokens are not worth a second forward pass


def shared_prefix_length(prompts: Sequence[Sequence[int]], minimum: int) -> int:
    """How many leading tokens all `prompts` share, worth running once: 0 for fewer than two
    prompts, below `minimum` tokens, or `minimum` < 1. Never a whole prompt: each row keeps its
    last prompt token, whose logits give the row's next token."""
    if minimum < 1 or len(prompts) < 2:
        return 0
    first = prompts[0]
    limit = min(len(p) for p in prompts) - 1
    shared = next((i for i in range(limit) if any(p[i] != first[i] for p in prompts[1:])), max(limit, 0))
    return shared if shared >= minimum else 0
