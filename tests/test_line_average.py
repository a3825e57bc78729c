"""bench/line_average.py follows each candidate back through its own line: the candidate before
it, unless a release is nearer (the line began again from the head), so an average never mixes
two lines."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from line_average import mean_of, newest_of_line, parents  # noqa: E402


def weights(value: float) -> dict[str, torch.Tensor]:
    return {"a.lora_A.weight": torch.full((2, 2), value), "a.lora_B.weight": torch.full((2, 2), -value)}


def test_a_line_begun_again_from_a_release_is_averaged_apart_from_the_one_before() -> None:
    release = weights(1.0)
    # a line drifting away from 1.0, then a new one begun from the release (1.0) and moving on
    line = [weights(1.01), weights(1.02), weights(1.3), weights(1.31), weights(0.99), weights(0.98)]
    parent = parents(line, [release])
    assert parent == [None, 0, 1, 2, None, 4]
    assert newest_of_line(5, parent, 4) == [5, 4]
    assert newest_of_line(3, parent, 3) == [3, 2, 1]
    assert torch.allclose(mean_of([line[5], line[4]])["a.lora_A.weight"], torch.full((2, 2), 0.985))
