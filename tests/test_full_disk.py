"""A full disk: the state directory is a small tmpfs; once it is filled, inference requests
(both dialects, plain and streaming), reports, scenario creation and rollbacks get clear 503s
in their dialect and write nothing half-way; freeing space recovers without a restart; a
server restarted on a full disk starts, serves reads and refuses writes; a restart afterwards
finds every acknowledged record, report and release intact. State-layer tests: a weights
release (LFS object) and commit-log appends on a full disk fail whole."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from reef.commit.state import ReefState
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TMPFS_SIZE = "6m"
USER = [{"role": "user", "content": "hello disk"}]
OPENAI_BODY = {"model": "m", "messages": USER}
ANTHROPIC_BODY = {"model": "m", "max_tokens": 16, "messages": USER}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill(disk: Path) -> Path:
    """Write one file until the file system refuses another byte."""
    filler = disk / "filler"
    block = b"\0" * 65536
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 512, 1):
            while True:
                try:
                    os.write(fd, block[:size])
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


def post(reef: ReefServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{reef.url}{path}", json=body, timeout=30)


def acknowledged_work(reef: ReefServer, tag: str) -> dict[str, Any]:
    """Some records, a report and a rollback release, all acknowledged with 2xx."""
    receipts = []
    for path, body in [
        ("/v1/chat/completions", OPENAI_BODY),
        ("/v1/messages", ANTHROPIC_BODY),
        ("/v1/chat/completions", {**OPENAI_BODY, "stream": True}),
        ("/v1/messages", {**ANTHROPIC_BODY, "stream": True}),
    ]:
        response = post(reef, path, body)
        assert response.status_code == 200, response.text
        receipts.append(response.headers["x-reef-agent-record-id"])
    report = post(reef, "/reef/report", {"references": receipts[:2], "score": 1, "feedback": tag})
    assert report.status_code == 200
    head = httpx.get(f"{reef.url}/reef/scenarios/default/releases").json()["releases"][-1]["release_id"]
    rollback = post(reef, "/reef/scenarios/default/rollback", {"release_id": head})
    assert rollback.status_code == 200, rollback.text
    return {
        "receipts": receipts,
        "report": report.json()["report_id"],
        "release": rollback.json()["release"]["release_id"],
    }


def counts(reef: ReefServer) -> tuple[int, int, int, int]:
    storage = httpx.get(f"{reef.url}/reef/status").json()["storage"]
    releases = httpx.get(f"{reef.url}/reef/scenarios/default/releases").json()["releases"]
    return storage["records"], storage["reports"], storage["scenarios"], len(releases)


def refused_while_full(reef: ReefServer, known_receipt: str) -> None:
    receipt = "written-while-full"
    attempts = {
        "openai": post(reef, "/v1/chat/completions", OPENAI_BODY),
        "openai stream": post(reef, "/v1/chat/completions", {**OPENAI_BODY, "stream": True}),
        "anthropic": post(reef, "/v1/messages", ANTHROPIC_BODY),
        "anthropic stream": post(reef, "/v1/messages", {**ANTHROPIC_BODY, "stream": True}),
        "receipt": httpx.post(
            f"{reef.base_url}/chat/completions",
            json=OPENAI_BODY,
            headers={"x-reef-agent-record-id": receipt},
            timeout=30,
        ),
    }
    for what, response in attempts.items():
        assert response.status_code == 503, f"{what}: {response.status_code} {response.text}"
        error = response.json()["error"]
        assert "full" in error["message"] or "space" in error["message"], f"{what}: {error}"
        if what.startswith("anthropic"):
            assert response.json()["type"] == "error" and error["type"] == "overloaded_error"
        else:
            assert error["type"] == "service_unavailable"
    assert httpx.get(f"{reef.url}/reef/records/{receipt}").status_code == 404
    first = httpx.get(f"{reef.url}/reef/scenarios/default/releases").json()["releases"][-1]["release_id"]
    for what, response in {
        "report": post(reef, "/reef/report", {"references": [known_receipt], "score": 1}),
        "report on an unstored receipt": post(reef, "/reef/report", {"references": [receipt], "score": 1}),
        "rollback": post(reef, "/reef/scenarios/default/rollback", {"release_id": first}),
        "create scenario": post(reef, "/reef/scenarios", {"name": f"new-{uuid.uuid4().hex[:6]}"}),
        "new scenario by request": httpx.post(
            f"{reef.base_url}/chat/completions", json=OPENAI_BODY, headers={"x-reef-scenario": "born-full"}, timeout=30
        ),
    }.items():
        if what == "report on an unstored receipt":  # never stored: 404 is the honest answer
            assert response.status_code == 404, f"{what}: {response.status_code} {response.text}"
            continue
        assert response.status_code == 503, f"{what}: {response.status_code} {response.text}"
        assert response.json()["error"]["message"], what


def check_intact(state_dir: Path, work: list[dict[str, Any]]) -> None:
    with ReefState.open(state_dir) as state:
        chain = state.chain("default")
        released = [r.release_id for r in chain.releases()]
        assert len(released) == len(set(released))
        for done in work:
            for receipt in done["receipts"]:
                assert state.store.get_record(receipt).status.value == "complete"
            assert state.store.get_report(done["report"]).id == done["report"]
            assert done["release"] in released
            state.artifacts.verify(done["release"])
        assert [e.step for e in chain.history()] == list(range(1, len(chain.history()) + 1))


def test_a_full_disk_gives_503s_and_freeing_space_recovers(
    small_disk: Path, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = {
        "state_dir": str(small_disk / "state"),
        "recipes": {"default": "skills"},
        "upstream": {"url": upstream.base_url, "model": "p", "timeout": 5},
    }
    reef = ReefServer(tmp_path / "work", settings).start()
    try:
        work = [acknowledged_work(reef, "before")]
        before = counts(reef)
        filler = fill(small_disk)
        refused_while_full(reef, work[0]["receipts"][0])
        assert counts(reef) == before, "a refused request changed the state"
        assert httpx.get(f"{reef.url}/healthz").status_code == 200
        filler.unlink()
        work.append(acknowledged_work(reef, "after"))  # the same process recovers
        filler = fill(small_disk)
        reef.kill()
        reef.stop()
        reef = ReefServer(tmp_path / "work", settings).start()  # a restart while full starts, reads, refuses writes
        for receipt in work[-1]["receipts"]:
            assert httpx.get(f"{reef.url}/reef/records/{receipt}").json()["record"]["status"] == "complete"
        assert post(reef, "/v1/chat/completions", OPENAI_BODY).status_code == 503
        filler.unlink()
        work.append(acknowledged_work(reef, "restarted while full"))
        reef.stop()
        check_intact(small_disk / "state", work)
        reef = ReefServer(tmp_path / "work", settings).start()  # and a restart finds everything
        work.append(acknowledged_work(reef, "restarted"))
        for done in work:
            for receipt in done["receipts"]:
                assert httpx.get(f"{reef.url}/reef/records/{receipt}").json()["record"]["status"] == "complete"
    finally:
        reef.stop()
    check_intact(small_disk / "state", work)


def test_a_weights_release_on_a_full_disk_is_storage_unavailable_and_logs_nothing(small_disk: Path) -> None:
    from reef.commit.release_chain import Candidate
    from reef.core.errors import StorageUnavailable
    from reef.core.types import ArtifactKind, Verdict

    state_dir = small_disk / "state"
    with ReefState.open(state_dir) as state:
        chain = state.create("weights", recipe="sao")
        head = chain.head()
        filler = fill(small_disk)
        adapter = Candidate({"adapter_model.safetensors": os.urandom(256 * 1024)}, ArtifactKind.WEIGHTS)
        with pytest.raises(StorageUnavailable, match="No space left"):
            chain.publish(adapter, expected_parent=head.release_id, verdict=Verdict("select"))
        assert chain.head() == head and chain.last_step() == 1
        filler.unlink()
        published = chain.publish(adapter, expected_parent=head.release_id, verdict=Verdict("select"))
        state.artifacts.verify(published.release_id)
    with ReefState.open(state_dir) as state:
        assert state.chain("weights").head().release_id == published.release_id
        assert [e.step for e in state.chain("weights").history()] == [1, 2]


def test_commit_log_appends_on_a_full_disk_fail_whole_and_leave_no_torn_line(small_disk: Path) -> None:
    from reef.core.errors import StorageUnavailable
    from reef.core.types import Verdict

    state_dir = small_disk / "state"
    with ReefState.open(state_dir) as state:
        chain = state.create("log", recipe="sao")
        head = chain.head().release_id
        fill(small_disk)
        appended = 0
        with pytest.raises(StorageUnavailable, match="commit log"):
            for appended in range(10_000):  # the log's last page may still hold a few lines
                chain.reject("sha256:" + f"{appended:064x}", head, verdict=Verdict("reject", {"n": appended}))
        assert chain.last_step() == 1 + appended
    with ReefState.open(state_dir) as state:  # no torn line: the log reopens whole
        assert [e.step for e in state.chain("log").history()] == list(range(1, appended + 2))
        (small_disk / "filler").unlink()
        state.chain("log").reject("sha256:" + "f" * 64, head, verdict=Verdict("reject"))
        assert state.chain("log").last_step() == appended + 2


def test_a_disk_that_fills_during_a_stream_ends_it_with_the_dialects_error(
    small_disk: Path, upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = {
        "state_dir": str(small_disk / "state"),
        "recipes": {"default": "skills"},
        "upstream": {"url": upstream.base_url, "model": "p", "timeout": 5},
    }
    with ReefServer(tmp_path / "work", settings) as reef:
        for path, body in [
            ("/v1/chat/completions", {**OPENAI_BODY, "stream": True}),
            ("/v1/messages", {**ANTHROPIC_BODY, "stream": True}),
        ]:
            upstream.script(text="one two three four five six", mode="slow", delay=0.1)
            with httpx.stream("POST", f"{reef.url}{path}", json=body, timeout=30) as response:
                assert response.status_code == 200
                receipt = response.headers["x-reef-agent-record-id"]
                chunks = response.iter_text()
                text = next(chunks)  # the record is in_progress on disk; now the disk fills
                filler = fill(small_disk)
                text += "".join(chunks)
            frames = [f for f in text.strip().split("\n\n") if f.strip() != "data: [DONE]"]
            assert "error" in frames[-1] and ("full" in frames[-1] or "space" in frames[-1]), frames[-1]
            filler.unlink()
            # the receipt still names a durable record; its outcome could not be written
            assert httpx.get(f"{reef.url}/reef/records/{receipt}").json()["record"]["status"] == "in_progress"
        assert post(reef, "/v1/chat/completions", OPENAI_BODY).status_code == 200
