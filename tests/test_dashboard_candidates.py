"""What the dashboard's candidates view reads from a real commit log (`reef.commit.candidate_fates`):
every batch with its fate, the gate's numbers and the training steps logged with it, and the
counts of each fate, the same after the state directory is opened again (a restart)."""

from __future__ import annotations

from pathlib import Path

from reef.commit.candidate_fates import candidate_fates, fate_counts
from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.types import ArtifactKind, Verdict

STEPS = [{"loss": 0.5, "kl": 0.01, "clipped_fraction": 0.1, "tokens": 40.0, "advantage": 0.25, "grad_norm": 1.5}]
PER_TASK = [{"index": i, "current": 0.0, "candidate": 1.0} for i in range(3)]


def adapter(n: int) -> Candidate:
    return Candidate(
        {"adapter_config.json": b'{"r": 16}', "adapter_model.safetensors": bytes([n]) * 4096}, ArtifactKind.WEIGHTS
    )


def test_every_candidate_its_fate_gate_numbers_steps_and_counts_survive_reopening(tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "state") as state:
        chain = state.create("math", "sao")
        creation = chain.head().release_id
        chain.begin_batch("b1", ["r1", "r2"], ["p1", "p2"], high_water=2, expected_step=1)
        select = Verdict(
            "select", {"candidate_score": 0.8, "current_score": 0.5, "wins": 3, "losses": 0, "per_task": PER_TASK}
        )
        published = chain.publish(adapter(1), creation, verdict=select, batch_id="b1", metrics={"steps": STEPS})
        chain.begin_batch("b2", ["r3"], ["p3"], high_water=3, expected_step=chain.last_step())
        reject = Verdict(
            "reject", {"candidate_score": 0.2, "current_score": 0.8, "wins": 0, "losses": 2, "p_value": 0.25}
        )
        chain.reject(
            "sha256:" + "c" * 64,
            published.release_id,
            verdict=reject,
            batch_id="b2",
            metrics={"canary": {"withdrawn": True, "scores": 9}},
        )
        chain.begin_batch("b3", ["r4"], ["p4"], high_water=4, expected_step=chain.last_step())
        chain.abandon_batch("b3", "superseded: batch b4", {"steps": STEPS, "training": STEPS[0]})
        chain.begin_batch("b4", ["r5"], ["p5"], high_water=5, expected_step=chain.last_step())

    with ReefState.open(tmp_path / "state") as state:  # a restart: read from the log alone
        rows = candidate_fates(state.chain("math").history())

    by_batch = {row["batch_id"]: row for row in rows}
    assert [row["batch_id"] for row in rows] == ["b1", "b2", "b3", "b4"]
    first = by_batch["b1"]
    assert first["fate"] == "published" and first["release_id"] == published.release_id
    assert first["from_release_id"] == creation and first["records"] == 2
    assert first["verdict"]["metrics"]["wins"] == 3 and first["verdict"]["metrics"]["tasks"] == 3
    assert "per_task" not in first["verdict"]["metrics"]  # the gate's numbers, not every task's answers
    assert first["steps"] == STEPS
    assert by_batch["b2"]["fate"] == "rejected" and by_batch["b2"]["withdrawn"] is True
    assert by_batch["b2"]["verdict"]["metrics"]["p_value"] == 0.25
    assert by_batch["b3"]["fate"] == "abandoned" and by_batch["b3"]["reason"] == "superseded: batch b4"
    assert by_batch["b3"]["steps"] == STEPS  # a superseded candidate's steps are kept too
    assert by_batch["b4"]["fate"] == "open"
    assert fate_counts(rows) == {
        "batches": 4,
        "published": 1,
        "pending_review": 0,
        "rejected": 1,
        "abandoned": 1,
        "open": 1,
        "withdrawn": 1,
    }


def test_a_candidate_held_for_review_counts_as_pending_until_promoted(tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "state") as state:
        chain = state.create("math", "sao")
        chain.begin_batch("b1", ["r1"], ["p1"], high_water=1, expected_step=1)
        held = chain.publish(adapter(2), chain.head().release_id, verdict=Verdict("review", {"wins": 2}), batch_id="b1")
        assert [row["fate"] for row in candidate_fates(chain.history())] == ["pending review"]
        chain.promote(held.release_id)
        assert [row["fate"] for row in candidate_fates(chain.history())] == ["published"]
