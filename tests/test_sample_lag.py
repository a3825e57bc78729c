"""bench/sample_lag.py on a real state directory: a chain whose logged batches name records that
the head and the canaries of earlier batches served."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reef.commit.state import ReefState
from reef.core.types import ReleaseRef
from reef.observe.store import Record, Report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import sample_lag  # noqa: E402


def canary(batch_id: str) -> ReleaseRef:
    return ReleaseRef(f"canary-{batch_id}", "c" * 64, None)


def test_how_many_candidates_back_each_trained_record_was_served(tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "state") as state:
        chain = state.create("demo", "sao")
        served = {"r1": chain.head().ref, "r2": chain.head().ref, "r3": canary("b1"), "r4": canary("b1"),
                  "r5": canary("b1"), "r6": canary("b2"), "r7": canary("elsewhere")}
        for record_id, release in served.items():
            state.store.put_record(Record(id=record_id, scenario="demo", release=release, request={"messages": []}))
        for batch_id, record_ids in (("b1", ["r1", "r2"]), ("b2", ["r3", "r4"]), ("b3", ["r5", "r6", "r7"])):
            chain.begin_batch(batch_id, record_ids, [], high_water=0, expected_step=chain.last_step())
            chain.abandon_batch(batch_id, "superseded")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "sample_lag.py"), str(tmp_path), "--every", "60"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    # b1's two from the head; b2's two from b1's canary (1 back); b3's from b1's (2 back),
    # b2's (1 back) and a canary of a batch not in the log
    assert "(7 records)  1:  43%  2:  14%  gone:  14%  release:  29%" in done.stdout, done.stdout


def test_how_much_longer_a_batch_would_have_waited_for_the_newest_candidates_samples(tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "state") as state:
        chain = state.create("demo", "sao")

        def served(record_ids: list[str], batch_id: str) -> None:
            for record_id in record_ids:
                state.store.put_record(Record(id=record_id, scenario="demo", release=canary(batch_id),
                                              request={"messages": []}))
                state.store.put_report(Report(f"rep-{record_id}", "demo", (record_id,), 1.0))

        chain.begin_batch("b1", [], [], high_water=0, expected_step=chain.last_step())
        served(["r1", "r2"], "b1")  # b1's canary served two before b2 was logged
        chain.begin_batch("b2", ["r1"], [], high_water=0, expected_step=chain.last_step(), max_open=3)
        served(["r3"], "b2")  # b2's canary served only one: b3 is left out
        chain.begin_batch("b3", ["r3"], [], high_water=0, expected_step=chain.last_step(), max_open=3)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "sample_lag.py"), str(tmp_path), "--fresh-wait", "2"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "1 of 2 batches would have waited 0.0 s more" in done.stdout, done.stdout


def test_how_long_each_candidate_trained_and_then_waited_for_the_next_batch(tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "state") as state:
        chain = state.create("demo", "sao")
        for batch_id in ("b1", "b2", "b3"):
            chain.begin_batch(batch_id, [], [], high_water=0, expected_step=chain.last_step(), max_open=3)
    logged = [at for at, _, _ in sample_lag.batches(tmp_path / "state")]
    line = tmp_path / "line"
    line.mkdir()
    # b1's candidate made at a quarter of the way to b2; b2's candidate never written; b3 is the last
    (line / f"{logged[0] + 0.25 * (logged[1] - logged[0]):.6f}.safetensors").write_bytes(b"")
    (line / "1.0.part").write_bytes(b"")  # a candidate half written is not one
    assert sample_lag.cycles(tmp_path) == [(pytest.approx(0.25 * (logged[1] - logged[0]), abs=1e-5),
                                            pytest.approx(0.75 * (logged[1] - logged[0]), abs=1e-5))]
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "sample_lag.py"), str(tmp_path), "--cycle"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert f"{tmp_path}: 1 candidates: training" in done.stdout, done.stdout


def test_the_cycle_reading_says_what_it_lacks(tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "state") as state:
        state.create("demo", "sao")
    assert "no line/ there" in sample_lag.cycle_text(tmp_path)
    (tmp_path / "line").mkdir()
    assert "no candidate in line/" in sample_lag.cycle_text(tmp_path)
