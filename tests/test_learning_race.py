"""bench/learning_race.py, the instrument that says how fast Reef learns: a few seconds of the
whole race on the tiny model (both arms, the evaluation, the table, the record and the plot), so
it cannot rot between real races; and its reading of a run's traffic from its experience store,
the clients' reported scores a minute, which show a line held at the base's answers by partial
credit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reef.commit.state import ReefState
from reef.core.types import Record, RecordStatus, ReleaseRef, Report
from reef.runtimes.model_files import MODEL_DIRNAME

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import learning_race  # noqa: E402

RELEASE = ReleaseRef("r" * 40, "sha256:" + "c" * 64, None)


def test_the_race_runs_both_arms_end_to_end_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The race reads the model from Reef's cache: a cache whose SmolLM2 folder is the tiny model
    makes the real script, the real `reef serve` and the real learner run in seconds (the tiny
    model learns nothing; a real race is 15 minutes on SmolLM2-135M-Instruct)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / MODEL_DIRNAME).symlink_to(tiny_model_dir, target_is_directory=True)
    out = tmp_path / "race.json"
    env = {**os.environ, "REEF_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "learning_race.py"),
            "--minutes",
            "0.05",
            "--snapshot-every",
            "1.5",
            "--concurrency",
            "2",
            "--out",
            str(out),
            "--workdir",
            str(tmp_path / "work"),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    bare, reef = record["arms"]["bare"], record["arms"]["reef"]
    for arm in (bare, reef):
        assert [s["second"] for s in arm["snapshots"]] == pytest.approx([0.0, 1.5, 3.0])
        assert all(0.0 <= s["success"] <= 1.0 for s in arm["snapshots"])
    assert bare["steps"], "the bare loop took no step"
    assert reef["requests"] > 0 and reef["reports"] > 0 and reef["errors"] == 0, reef["last_error"]
    assert reef["traffic"] and record["summary"]["scored_rollouts"]["reef"] == reef["reports"]
    assert "time to +30 points" in done.stdout and out.with_suffix(".png").stat().st_size > 0


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
