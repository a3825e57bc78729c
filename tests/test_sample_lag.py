"""bench/sample_lag.py on a real state directory: a chain whose logged batches name records that
the head and the canaries of earlier batches served."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from reef.commit.state import ReefState
from reef.core.types import ReleaseRef
from reef.observe.store import Record

ROOT = Path(__file__).resolve().parent.parent


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
