"""Full-weight releases in the artifact store: each release says what weights it carries; a layer
shard that did not change between releases is kept once (the size report counts it as shared);
compaction frees old releases' optimiser state but never the newest releases' nor any weights,
and a compacted release still reads, rolls back and trains from its weights; `reef compact`
reports the bytes freed and `reef inspect --json` the sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from reef.cli import main
from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.commit.weights_store import compact_optimiser, release_weights, size_report
from reef.core.training import TRAINING_FOLDER, weights_kind
from reef.core.types import ArtifactKind, Verdict
from tests.helpers.full_weights import full_weight_files
from tests.helpers.lora import lora_files

SELECT = Verdict("select", {"wins": 3})
OPTIMISER = 64 * 1024  # bytes of stand-in optimiser state per release


def _publish_three(state: ReefState, tiny_model_dir: Path) -> list[str]:
    chain = state.create("full", "sao")
    ids = [chain.head().release_id]
    for seed in (1, 2, 3):  # layer 1 changes each time; the embeddings' and layer 0's shards never do
        files = full_weight_files(tiny_model_dir, seed=seed, optimiser_bytes=OPTIMISER)
        ids.append(chain.publish(Candidate(files, ArtifactKind.WEIGHTS), ids[-1], verdict=SELECT).release_id)
    return ids


def test_sizes_share_unchanged_shards_and_compaction_keeps_what_serves(tiny_model_dir: Path, tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "state") as state:
        ids = _publish_three(state, tiny_model_dir)
        store = state.artifacts
        assert [release_weights(store, r) for r in ids] == [None, "full", "full", "full"]
        first = store.files(ids[1])
        shards = {n: len(d) for n, d in first.items() if n.endswith(".safetensors") and "/" not in n}
        changed = max(size for name, size in shards.items() if name.startswith("model-00003"))
        before = size_report(store, ids)
        # three releases name every shard; the unchanged two are kept once
        assert before.weights_bytes == sum(shards.values()) + 2 * changed
        assert before.shared_bytes == 2 * (sum(shards.values()) - changed)
        assert before.optimiser_bytes == 3 * len(first["training/optimizer-rank0.safetensors"])

        done = compact_optimiser(store, ids, keep=2)
        assert done.objects == 1 and done.freed_bytes == len(first["training/optimizer-rank0.safetensors"])
        after = size_report(store, ids)
        assert after.weights_bytes == before.weights_bytes and after.compacted_bytes == done.freed_bytes
        assert after.optimiser_bytes == before.optimiser_bytes - done.freed_bytes
        assert compact_optimiser(store, ids, keep=2).objects == 0  # nothing left to free
        for release_id in ids[2:]:  # the newest two keep their optimiser
            assert any(n.startswith(TRAINING_FOLDER + "optimizer") for n in store.files(release_id))
        old = store.files(ids[1])  # reads, without its optimiser state, with all its weights
        assert weights_kind(old) == "full" and "training/optimizer-rank0.safetensors" not in old
        assert {n: d for n, d in old.items() if not n.startswith(TRAINING_FOLDER)} == {
            n: d for n, d in first.items() if not n.startswith(TRAINING_FOLDER)
        }
        store.verify(ids[1])
        chain = state.chain("full")
        back = chain.rollback(ids[1], ids[-1])  # a rollback to a compacted release publishes its weights
        assert release_weights(store, back.release_id) == "full"
        assert store.files(back.release_id) == old


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_releases_say_lora(tiny_model_dir: Path, tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "state") as state:
        chain = state.create("adapters", "sao")
        base = chain.head().release_id
        adapter = lora_files(tiny_model_dir, tmp_path / "lora")
        lora = chain.publish(Candidate(adapter, ArtifactKind.WEIGHTS), base, verdict=SELECT).release_id
        assert release_weights(state.artifacts, lora) == "lora"
        assert release_weights(state.artifacts, base) is None


def test_reef_compact_and_inspect_report_bytes(tiny_model_dir: Path, tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "state") as state:
        _publish_three(state, tiny_model_dir)
    runner = CliRunner()
    shown = runner.invoke(main, ["inspect", "--state-dir", str(tmp_path / "state"), "--json"])
    assert shown.exit_code == 0, shown.output
    sizes = json.loads(shown.stdout)[0]["sizes"]
    assert sizes["releases"] == 4 and sizes["optimiser_bytes"] > 3 * OPTIMISER and sizes["shared_bytes"] > 0
    done = runner.invoke(main, ["compact", "--state-dir", str(tmp_path / "state"), "--keep", "1"])
    assert done.exit_code == 0, done.output
    assert "full: freed 2 optimiser object(s)" in done.output
    again = json.loads(runner.invoke(main, ["inspect", "--state-dir", str(tmp_path / "state"), "--json"]).stdout)
    assert again[0]["sizes"]["optimiser_bytes"] < sizes["optimiser_bytes"] / 2
