"""The commit log: steps +1, fsynced appends, identical retries, torn lines, damage, races."""

from __future__ import annotations

import json
import multiprocessing
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from reef.commit.commit_log import CommitLog
from reef.core.errors import Conflict, Corruption, StaleHead
from reef.core.types import CommitEntry, Operation, ReleaseRef


def entry(step: int, scenario: str = "s", **fields: object) -> CommitEntry:
    return CommitEntry(scenario=scenario, step=step, operation=Operation.TRAINING,
                       release=ReleaseRef(f"r{step}", f"c{step}"), **fields)  # type: ignore[arg-type]


def test_steps_append_in_order_and_survive_reopen(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "s.jsonl", scenario="s")
    for step in range(1, 4):
        log.append(entry(step, metrics={"loss": step / 10}), expected_step=step - 1)
    log.close()
    again = CommitLog(tmp_path / "s.jsonl", scenario="s")
    assert [e.step for e in again.entries()] == [1, 2, 3]
    assert again.entries()[2].metrics == {"loss": 0.3}
    assert all(e.recorded_at > 0 for e in again.entries())


def test_identical_retry_returns_the_original(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "s.jsonl")
    first = log.append(entry(1), expected_step=0)
    retried = log.append(replace(entry(1), recorded_at=123.0), expected_step=0)
    assert retried == first
    assert log.last_step == 1


def test_other_content_for_a_committed_step_is_a_conflict(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "s.jsonl")
    log.append(entry(1), expected_step=0)
    with pytest.raises(Conflict, match="step 1"):
        log.append(entry(1, metrics={"other": 1}), expected_step=0)
    assert log.last_step == 1


def test_stale_expected_step_is_a_conflict(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "s.jsonl")
    log.append(entry(1), expected_step=0)
    log.append(entry(2), expected_step=1)
    with pytest.raises(StaleHead):
        log.append(entry(3), expected_step=1)
    assert log.last_step == 2


def test_torn_last_line_is_truncated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    log = CommitLog(path)
    log.append(entry(1), expected_step=0)
    log.close()
    whole = path.read_bytes()
    with path.open("ab") as f:
        f.write(b'{"record":"reef-commit/1","scenario":"s","st')
    reopened = CommitLog(path)
    assert reopened.last_step == 1
    assert path.read_bytes() == whole
    reopened.append(entry(2), expected_step=1)
    assert [e.step for e in CommitLog(path).entries()] == [1, 2]


def test_damage_before_the_last_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    log = CommitLog(path)
    for step in range(1, 4):
        log.append(entry(step), expected_step=step - 1)
    log.close()
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1][:20] + b"#garbage#" + lines[1][20:]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(Corruption) as info:
        CommitLog(path)
    assert info.value.line == 2 and str(path) in str(info.value)


def test_a_complete_but_unparsable_last_line_is_damage_not_a_tear(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    log = CommitLog(path)
    log.append(entry(1), expected_step=0)
    log.close()
    with path.open("ab") as f:
        f.write(b"not json\n")
    with pytest.raises(Corruption, match=":2:"):
        CommitLog(path)


def test_a_step_out_of_sequence_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(entry(1).to_json()) + "\n" + json.dumps(entry(3).to_json()) + "\n")
    with pytest.raises(Corruption, match="step 3 where step 2 belongs"):
        CommitLog(path)


def test_threads_racing_on_one_step_have_exactly_one_winner(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "s.jsonl")
    log.append(entry(1), expected_step=0)
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def contend(i: int) -> None:
        barrier.wait()
        try:
            log.append(entry(2, metrics={"writer": i}), expected_step=1)
            outcomes.append("won")
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("won") == 1 and outcomes.count("conflict") == 7
    assert log.last_step == 2


def _append_from_process(path: str, writer: int, start: multiprocessing.synchronize.Event, out: multiprocessing.Queue) -> None:
    log = CommitLog(path)
    start.wait()
    try:
        log.append(entry(2, metrics={"writer": writer}), expected_step=1)
        out.put("won")
    except Conflict:
        out.put("conflict")


def test_processes_racing_on_one_step_have_exactly_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    CommitLog(path).append(entry(1), expected_step=0)
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_append_from_process, args=(str(path), i, start, out)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=30)
    results = sorted(out.get(timeout=5) for _ in procs)
    assert results == ["conflict", "conflict", "conflict", "won"]
    assert [e.step for e in CommitLog(path).entries()] == [1, 2]


def test_a_second_handle_sees_steps_appended_by_the_first(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    a, b = CommitLog(path), CommitLog(path)
    a.append(entry(1), expected_step=0)
    assert b.last_step == 1
    with pytest.raises(StaleHead):
        b.append(entry(3), expected_step=0)
    b.append(entry(2), expected_step=1)
    assert a.last_step == 2
