"""bench/kill_loops.py, kept from rotting: two SIGKILLs of one `reef serve` under the mixed load
count what was acknowledged, find it all and inspect the state clean; its check does find a
receipt, a report and a release that are not there; its options refuse what makes no sense."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import kill_loops

from reef.observe.sqlite_store import SQLiteStore
from tests.helpers.acked_check import check
from tests.helpers.mixed_load import MESSAGES, Ledger
from tests.helpers.process_tree import descendants, kill_tree
from tests.helpers.reef_server import ReefServer
from tests.helpers.reef_workers import ReefWorkers
from tests.scripted_upstream import ScriptedUpstream


def test_two_kills_of_one_process_lose_nothing_and_inspect_clean(
    tmp_path: Path,
) -> None:
    out = tmp_path / "kill_loops.json"
    status = kill_loops.main(
        [
            "--loops",
            "one",
            "--kills",
            "2",
            "--gap",
            "0.5:1",
            "--clients",
            "3",
            "--workdir",
            str(tmp_path / "work"),
            "--out",
            str(out),
        ]
    )
    (loop,) = json.loads(out.read_text())["loops"]
    assert status == 0, loop["failures"]
    assert loop["sigkills_total"] == 2 and loop["serve_again"]["serve"]["count"] == 2
    final = loop["final"]
    for kind in ("receipts", "reports"):
        assert final[kind]["acked"] > 0 and final[kind]["present"] == final[kind]["acked"]
        assert final[kind]["lost"] == final[kind]["duplicated"] == 0
    assert loop["checks"] == 3 and loop["checks_failed"] == 0  # after each restart, and at the end
    assert loop["inspections"] >= 3 and loop["inspections_clean"] == loop["inspections"]
    assert loop["fsck"] == {"artifacts.git": "clean"}


def test_the_check_counts_what_is_not_there_as_lost(tmp_path: Path) -> None:
    with (
        ScriptedUpstream(record=False) as upstream,
        ReefServer(tmp_path, kill_loops.base_settings(upstream)) as reef,
    ):
        first = httpx.post(f"{reef.url}/reef/scenarios", json={"name": "s"}, timeout=30).json()["head"]["release_id"]
        answer = httpx.post(
            f"{reef.base_url}/chat/completions",
            headers={"x-reef-scenario": "s"},
            timeout=30,
            json={"model": "m", "messages": MESSAGES},
        )
        receipt = answer.headers["x-reef-agent-record-id"]
        ledger = Ledger({"s": first})
        ledger.receipt(receipt, "s", "chat")
        ledger.receipt("never-served", "s", "chat")
        ledger.report("never-reported", receipt)
        ledger.release("never-released", "s", 0.1)
        result = check(
            ledger.snapshot(),
            lambda: SQLiteStore(reef.state_dir / "experience.db"),
            [reef.url],
            random.Random(0),
        )
    assert (result.receipts.acked, result.receipts.present, result.receipts.lost) == (
        2,
        1,
        1,
    )
    assert (result.reports.lost, result.releases.lost) == (1, 1)
    assert not result.ok


@pytest.mark.parametrize(
    "argv",
    [["--kills", "1,2"], ["--kills", "-1"], ["--loops", "three"], ["--gap", "2:1"]],
)
def test_options_that_make_no_sense_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        kill_loops.parse_args(argv)


def test_a_lock_file_still_there_is_told_from_one_cleared_or_made_again(
    tmp_path: Path,
) -> None:
    repository = tmp_path / "artifacts.git" / "refs" / "reef" / "scenarios"
    repository.mkdir(parents=True)
    stale, cleared, remade = (repository / f"{name}.lock" for name in ("stale", "cleared", "remade"))
    for lock in (stale, cleared, remade):
        lock.write_text("x")
    (tmp_path / "outside.lock").write_text("x")  # not in a git repository: not git's
    found = kill_loops.stale_git_locks(tmp_path)
    assert found == sorted(map(str, (cleared, remade, stale)))
    left = kill_loops.lock_identities(found)
    cleared.unlink()
    remade.unlink()
    (repository / "other.lock").write_text("y")  # takes remade's inode, perhaps
    remade.write_text("y")  # a live writer's new lock on the same ref
    os.utime(remade, ns=(1, 1))
    assert kill_loops.locks_persisting(left) == [str(stale)]


def test_a_workers_child_between_fork_and_exec_is_not_taken_for_a_worker(
    tmp_path: Path,
) -> None:
    workers = ReefWorkers(tmp_path, {})
    forks = "import os, time\nif os.fork() == 0:\n    time.sleep(30)\nelse:\n    time.sleep(30)\n"
    worker = subprocess.Popen([sys.executable, "-c", forks, "--worker-of", "0", "-c", str(workers.config)])
    try:
        deadline = time.monotonic() + 10
        while len(descendants(worker.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert descendants(worker.pid), "the stand-in worker should have forked"
        assert workers.worker_pids() == [worker.pid]
    finally:
        kill_tree(worker.pid)
        worker.wait()
