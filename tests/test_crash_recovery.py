"""Invariants 1, 3, 6: a writer killed with SIGKILL at random moments, again and again, loses
no acknowledged record, report or step, duplicates nothing, and the state reopens cleanly."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from reef.commit.state import ReefState

ROOT = Path(__file__).resolve().parent.parent


def run_until_killed(state_dir: Path, run: str, rng: random.Random) -> list[str]:
    """Start a writer, let it work for a random moment, SIGKILL it; its complete ack lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.crash_writer", str(state_dir), run],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env=env,
        bufsize=0,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"READY"
    fd = child.stdout.fileno()
    os.set_blocking(fd, False)
    output = bytearray()
    deadline = time.monotonic() + rng.uniform(0.05, 0.6)
    while time.monotonic() < deadline:
        try:
            output += os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    os.set_blocking(fd, True)
    output += child.stdout.read()
    # only complete lines are acknowledgements; a line cut by the kill acknowledged nothing
    return [line.decode() for line in bytes(output).split(b"\n")[:-1] if line]


def test_sigkill_at_random_moments_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(20261130)
    acked: list[str] = []
    for run in range(8):
        acked += run_until_killed(tmp_path, f"run{run}", rng)
        with ReefState.open(tmp_path) as state:
            entries = state.chain("crash").history()
            assert [e.step for e in entries] == list(range(1, len(entries) + 1))
            logged = [e.release.release_id for e in entries if e.publishes_release]
            assert len(logged) == len(set(logged)), "a release was logged twice"
            for line in acked:
                kind, *rest = line.split()
                if kind == "R":
                    assert state.store.get_record(rest[0]).id == rest[0]
                elif kind == "P":
                    assert state.store.get_report(rest[0]).id == rest[0]
                elif kind == "S":
                    assert entries[int(rest[0]) - 1].release.release_id == rest[1]
                    state.artifacts.verify(rest[1])
            assert state.artifacts.scenario_head("crash") == logged[-1]
            acked_records = sum(line.startswith("R ") for line in acked)
            # at most one unacknowledged record in flight per killed run; no duplicates
            assert acked_records <= state.store.count_records("crash") <= acked_records + run + 1
    writes = [line for line in acked if line.startswith("R ")]
    assert len(writes) > 20, "the writer should get through some work between kills"
