"""bench/staleness.py's variants: what a `K:L:loss[:E]` says, and what it refuses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import staleness  # noqa: E402


def test_a_variant_names_steps_lag_loss_and_optionally_the_clips_top() -> None:
    assert staleness.parse_variant("2:1:cispo") == (2, 1, "cispo", 0.28)
    assert staleness.parse_variant("1:0:mask:4") == (1, 0, "mask", 4.0)


@pytest.mark.parametrize("variant", ["2:1", "2:1:adam", "0:1:cispo", "2:-1:cispo", "2:1:cispo:0", "2:1:cispo:x",
                                     "2:1:cispo:4:5"])
def test_a_malformed_variant_is_refused(variant: str) -> None:
    with pytest.raises(ValueError):
        staleness.parse_variant(variant)
