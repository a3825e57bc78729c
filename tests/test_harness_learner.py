"""The harness learner on a real state directory, without a server: batches are logged before
proposing, a failing gate closes its batch (so learning goes on), a restart resumes an open
batch, and no record is used twice."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from reef.commit.state import ReefState
from reef.core.canonical import content_id_of
from reef.core.learned import LearnedCandidate
from reef.core.types import Operation, Record, RecordStatus, Report, Verdict
from reef.grow.learner import Learner
from reef.recipes.proposers.distill import DistillProposer
from reef.recipes.skills import SkillsConfig, SkillsRecipe
from reef.serve.learning import wire_learner

FEEDBACK = "Answer with a single word only."


def report_failures(state: ReefState, start: int, n: int) -> None:
    head = state.chain("s").head().ref
    for i in range(start, start + n):
        state.store.put_record(Record(f"rec{i}", "s", head, {"messages": [{"role": "user", "content": f"q{i}"}]}))
        state.store.finish_record(f"rec{i}", RecordStatus.COMPLETE, response={"text": f"a long answer {i}"})
        state.store.put_report(Report(f"rep{i}", "s", (f"rec{i}",), 0.0, FEEDBACK))


def learner(state: ReefState, decide: Any) -> Learner:
    async def head_files() -> dict[str, bytes]:
        return {}

    config = SkillsConfig.model_validate({"min_recurrence": 3, "successes": 0, "gate": {"holdout_fraction": 0.0}})
    recipe = SkillsRecipe(config, proposer=DistillProposer(config))
    return wire_learner(state.chain("s"), state.store, recipe, decide, head_files)


def test_a_failing_gate_closes_its_batch_and_a_restart_resumes_an_open_one(tmp_path: Path) -> None:
    state = ReefState.open(tmp_path / "state")
    state.create("s", "skills")
    report_failures(state, 0, 3)

    async def broken_gate(candidate: LearnedCandidate) -> Verdict:
        raise ValueError("the scorer crashed")

    with pytest.raises(ValueError):
        asyncio.run(learner(state, broken_gate).step())
    history = state.chain("s").history()
    assert [e.operation for e in history[-2:]] == [Operation.BATCH, Operation.ABANDON]
    assert "the scorer crashed" in history[-1].metrics["reason"]

    report_failures(state, 3, 3)
    seen: list[LearnedCandidate] = []

    async def rejecting_gate(candidate: LearnedCandidate) -> Verdict:
        seen.append(candidate)
        verdict = Verdict("reject", {"gate": "test"})
        state.chain("s").reject(
            content_id_of(candidate.files),
            candidate.base_release_id,
            verdict=verdict,
            batch_id=candidate.batch_id,
            high_water=candidate.high_water,
        )
        return verdict

    again = learner(state, rejecting_gate)
    assert "rec0" in again.consumed  # an abandoned batch's records stay used after a restart
    assert asyncio.run(again.step()) is True
    assert [m["body"] for m in seen[0].metadata["mutations"]] == [FEEDBACK]
    batches = [e.batch for e in state.chain("s").history() if e.operation is Operation.BATCH]
    assert [b["record_ids"] for b in batches] == [["rec0", "rec1", "rec2"], ["rec3", "rec4", "rec5"]]

    report_failures(state, 6, 3)
    chain = state.chain("s")
    chain.begin_batch(
        "open1", ["rec6", "rec7", "rec8"], ["rep6", "rep7", "rep8"], high_water=9, expected_step=chain.last_step()
    )  # as if the process died right after logging it
    resumed = learner(state, rejecting_gate)
    asyncio.run(resumed.recover())
    assert seen[-1].batch_id == "open1" and state.chain("s").open_batch() is None
    assert asyncio.run(resumed.step()) is False  # nothing new: records 6-8 are not taken again
    state.close()
