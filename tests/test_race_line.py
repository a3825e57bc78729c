"""bench/race_line.py's `fresh`: a batch waits for the newest candidate's own samples, puts them
last, and stops waiting once `fresh_max_wait` has passed (the canary may have stopped)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from race_line import LineConfig, LineSAO  # noqa: E402

from reef.core.training import Rollout  # noqa: E402
from reef.grow.rollouts import ScoredRollout  # noqa: E402


class Drops:
    def __init__(self) -> None:
        self.dropped: dict[str, int] = {}

    def drop(self, reason: str, count: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + count


def recipe_with(served: list[str], tmp_path: Path, fresh: int = 4, made_ago: float = 0.0) -> LineSAO:
    recipe = LineSAO(LineConfig(line_dir=str(tmp_path), batch_size=2, steps_per_candidate=2, fresh=fresh))
    for n, release in enumerate(served):
        recipe.pending.append(ScoredRollout(f"rep{n}", n, 1.0, Rollout(f"r{n}", "rel", [1], [2], [-0.1])))
        recipe.served_by[f"r{n}"] = release
    recipe.newest = ("canary-b2", time.monotonic() - made_ago)
    return recipe


def test_a_batch_waits_for_the_newest_candidates_samples_and_puts_them_last(tmp_path: Path) -> None:
    view = Drops()
    served = ["canary-b1", "canary-b2", "canary-b1", "canary-b2", "canary-b2", "canary-b1"]
    recipe = recipe_with(served, tmp_path)
    assert asyncio.run(recipe.next_batch(view)) is None  # three of the four it waits for
    assert len(recipe.pending) == 6 and not view.dropped
    recipe.pending.append(ScoredRollout("rep6", 6, 1.0, Rollout("r6", "rel", [1], [2], [-0.1])))
    recipe.served_by["r6"] = "canary-b2"
    batch = asyncio.run(recipe.next_batch(view))
    assert batch is not None and batch.record_ids == ["r1", "r3", "r4", "r6"]
    assert view.dropped == {"superseded": 3} and recipe.pending == [] and recipe.served_by == {}


def test_past_the_longest_wait_the_newest_samples_make_the_batch(tmp_path: Path) -> None:
    served = ["canary-b1", "canary-b2", "canary-b1", "canary-b1", "canary-b1"]
    batch = asyncio.run(recipe_with(served, tmp_path, made_ago=60.0).next_batch(Drops()))
    assert batch is not None and batch.record_ids == ["r1", "r2", "r3", "r4"]


def test_without_fresh_the_batch_is_the_newest_samples(tmp_path: Path) -> None:
    served = ["canary-b1", "canary-b2", "canary-b1", "canary-b1", "canary-b1"]
    batch = asyncio.run(recipe_with(served, tmp_path, fresh=0).next_batch(Drops()))
    assert batch is not None and batch.record_ids == ["r1", "r2", "r3", "r4"]
