"""Adding a recipe is one file: `tests/helpers/imitation_recipe.py`, named in the config by its
dotted path, learns on the tiny model through a real `reef serve`: its batches are logged, it
trains through the primitives, the gate publishes its adapter, and the adapter makes the
imitated answers more likely."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.commit.state import ReefState
from reef.core.types import Operation
from tests.helpers.reef_server import ReefServer
from tests.test_learning import decisions, feed_until

torch = pytest.importorskip("torch")
RECIPE = "tests.helpers.imitation_recipe:ImitationRecipe"
pytestmark = [
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:Adapter .* was active which is now deleted:UserWarning"),
    pytest.mark.filterwarnings("ignore:Already found a `peft_config` attribute:UserWarning"),
]


def test_a_recipe_named_by_dotted_path_learns(tiny_model_dir: Path, tmp_path: Path) -> None:
    settings = {
        "embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": 8, "threads": 1},
        "recipes": {"default": RECIPE},
        "learner": {
            "poll_interval": 0.1,
            "train_threads": 1,
            RECIPE: {"batch_size": 4, "steps": 3, "lr": 0.01},
            "gate": {"holdout_fraction": 0.3, "offline_bound": 1000.0},
        },
    }
    with ReefServer(tmp_path, settings) as reef:
        feed_until(reef, "copy", lambda: [d for d in decisions(reef, "copy") if d["verdict"]["decision"] == "select"])
    with ReefState.open(reef.state_dir) as state:
        chain = state.chain("copy")
        assert chain.binding["recipe"] == RECIPE
        batches = {e.batch["batch_id"]: e.batch for e in chain.history() if e.operation is Operation.BATCH}
        release = [r for r in chain.releases() if r.operation is Operation.TRAINING][-1]  # the first published
        files = state.artifacts.files(release.release_id)
        parent = state.artifacts.files(release.parent_release_id or "")  # what it trained on from
        assert state.artifacts.manifest(release.release_id).metadata["recipe"] == "imitation"  # its own name
        trained = batches[release.metrics["batch_id"]]["record_ids"]
        records = [state.store.get_record(rid) for rid in trained]
        assert all(state.store.reports_for(rid)[-1].score >= 1.0 for rid in trained)  # only the good answers
    from reef.grow.trainer import LoRATrainer

    seqs = [(list(r.response["prompt_token_ids"]), list(r.token_ids)) for r in records]
    trainer = LoRATrainer(tiny_model_dir, threads=1)
    before, after = trainer.logprobs(parent or None, seqs), trainer.logprobs(files, seqs)
    assert sum(map(sum, after)) > sum(map(sum, before))
