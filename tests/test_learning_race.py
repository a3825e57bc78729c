"""bench/learning_race.py's reading of a run's traffic from its experience store: the clients'
reported scores a minute, which show a line held at the base's answers by partial credit."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from reef.commit.state import ReefState
from reef.core.types import Record, RecordStatus, ReleaseRef, Report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import learning_race  # noqa: E402

RELEASE = ReleaseRef("r" * 40, "sha256:" + "c" * 64, None)


def _reported(state: ReefState, scores: list[float]) -> None:
    for i, score in enumerate(scores):
        record = state.store.put_record(Record(f"rec{i}-{score}", learning_race.SCENARIO, RELEASE, {"messages": []}))
        state.store.finish_record(record.id, RecordStatus.COMPLETE, response={"content": "x"})
        state.store.put_report(Report(f"rep{i}-{score}", learning_race.SCENARIO, (record.id,), score))


def test_the_traffic_a_minute_is_its_reported_scores_mean_and_exact_share(tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "state") as state:
        _reported(state, [1.0, 0.2, 0.0, 0.2])
    minute = learning_race._traffic(tmp_path / "state", started_wall=time.time() - 90)  # noqa: SLF001
    assert minute == [{"minute": 1, "samples": 4, "mean_score": 0.35, "exact": 0.25}]
