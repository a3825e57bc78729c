"""Stale git locks (issue 63, item 1): a git killed while it moved a ref leaves `<ref>.lock`.

Before, nothing removed it: every publish or rollback of that scenario failed with 503 after
5.8 s, across restarts, and a front end on PostgreSQL with an artifact remote exited 1 at every
start. Now each git write removes such a lock while holding what proves its writer dead (the
scenario's commit log; the fetch lock; age on the remote), recovery does so at open, and
`reef inspect` says what it removed. Real git, real files, real `reef serve` processes, real
PostgreSQL (skipped without it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import httpx
import pytest
from click.testing import CliRunner

from reef.cli import main as reef_cli
from reef.commit import git_locks
from reef.commit.artifacts import FETCHED_PREFIX, REF_PREFIX, ArtifactStore
from reef.commit.state import ReefState
from reef.core.canonical import scenario_key
from reef.core.errors import StorageUnavailable
from tests.helpers.reef_server import ReefServer
from tests.pg import postgres_dsn  # noqa: F401  (session fixture)
from tests.scripted_upstream import ScriptedUpstream

FAST_S = 1.0  # a rollback with nothing in its way takes well under this


def lock_of(repo: Path, prefix: str, scenario: str, *, age_s: float = 0.0) -> Path:
    """Create `<ref>.lock` as a killed git leaves it, `age_s` old."""
    lock = repo / f"{prefix}{scenario_key(scenario)}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("0" * 40 + "\n")
    if age_s:
        past = time.time() - age_s
        os.utime(lock, (past, past))
    return lock


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True, text=True, check=True).stdout


# -- when a lock is stale ----------------------------------------------------------------------


def test_a_lock_its_writer_removes_is_left_to_it(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text("")
    threading.Timer(0.2, lock.unlink).start()  # a live git finishing its update
    start = time.monotonic()
    assert git_locks.clear_stale(lock, 5.0) is None
    assert time.monotonic() - start < 2.0


def test_an_old_lock_goes_at_once_and_a_young_one_once_it_is_old_enough(tmp_path: Path) -> None:
    old = tmp_path / "old.lock"
    old.write_text("")
    os.utime(old, (time.time() - 60, time.time() - 60))
    start = time.monotonic()
    cleared = git_locks.clear_stale(old, 5.0)
    assert cleared is not None and cleared.age_s >= 60 and not old.exists()
    assert time.monotonic() - start < 0.5
    young = tmp_path / "young.lock"
    young.write_text("")
    future = time.time() + 3600  # an mtime in the future still goes once watched long enough
    os.utime(young, (future, future))
    start = time.monotonic()
    assert git_locks.clear_stale(young, 0.5) is not None and not young.exists()
    assert time.monotonic() - start >= 0.5


# -- one state directory -----------------------------------------------------------------------


def test_a_lock_left_on_a_scenario_ref_no_longer_fails_its_rollback(tmp_path: Path) -> None:
    with ReefState.open(tmp_path) as state:
        first = state.create("sc", "skills").head().release_id
        lock = lock_of(state.artifacts.root, REF_PREFIX, "sc")  # a git killed just now
        start = time.monotonic()
        release = state.chain("sc").rollback(first, None)  # before: StorageUnavailable after 5.8 s
        took = time.monotonic() - start
        assert not lock.exists()
        assert state.artifacts.scenario_head("sc") == release.release_id
        assert took < git_locks.OWNED_AGE_S + FAST_S
        assert [c.path for c in state.artifacts.cleared_locks] == [str(lock)]


def test_recovery_removes_the_locks_a_killed_git_left_and_inspect_says_so(tmp_path: Path) -> None:
    with ReefState.open(tmp_path) as state:
        state.create("sc", "skills")
        repo = state.artifacts.root
    on_ref = lock_of(repo, REF_PREFIX, "sc", age_s=30)
    on_fetched = lock_of(repo, FETCHED_PREFIX, "sc", age_s=30)
    result = CliRunner().invoke(reef_cli, ["inspect", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"removed a stale git lock {on_ref}" in result.output
    assert f"removed a stale git lock {on_fetched}" in result.output
    assert not on_ref.exists() and not on_fetched.exists()
    again = CliRunner().invoke(reef_cli, ["inspect", "--state-dir", str(tmp_path)])
    assert again.exit_code == 0 and "git lock" not in again.output, again.output


def test_inspect_names_a_lock_on_a_ref_reef_does_not_own(tmp_path: Path) -> None:
    with ReefState.open(tmp_path) as state:
        state.create("sc", "skills")
        foreign = state.artifacts.root / "refs" / "heads" / "main.lock"
    foreign.parent.mkdir(parents=True, exist_ok=True)
    foreign.write_text("")
    result = CliRunner().invoke(reef_cli, ["inspect", "--state-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert f"git lock {foreign} is still there" in result.stderr
    assert foreign.exists()  # not Reef's to remove


def test_a_lock_a_killed_push_left_on_the_remote_goes_once_it_is_old(tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    with ReefState.open(tmp_path / "state", artifacts_remote=str(remote)) as state:
        first = state.create("sc", "skills").head().release_id
        lock = lock_of(remote, REF_PREFIX, "sc", age_s=git_locks.SHARED_AGE_S + 1)
        start = time.monotonic()
        release = state.chain("sc").rollback(first, None)  # before: StorageUnavailable (the push failed)
        assert time.monotonic() - start < FAST_S
        assert git(remote, "rev-parse", f"{REF_PREFIX}{scenario_key('sc')}").strip() == release.release_id
        assert not lock.exists()


def test_git_runs_out_of_reach_of_a_kill_of_reefs_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A git Reef starts (seen here through the ssh command of a fetch, a child of that git) runs in
    a session and process group of its own: a SIGKILL of Reef's process group (a supervisor's or a
    script's `kill -9 -PGID`; a terminal's Ctrl-C is SIGINT to it) lets it finish its ref update."""
    seen = tmp_path / "seen"
    ssh = tmp_path / "ssh"
    ssh.write_text(
        f"#!{sys.executable}\nimport os\n"
        f"open({str(seen)!r}, 'w').write(f'{{os.getsid(0)}} {{os.getpgid(0)}}')\nraise SystemExit(1)\n"
    )
    ssh.chmod(0o755)
    monkeypatch.setenv("GIT_SSH_COMMAND", str(ssh))  # the environment a remote call keeps
    store = ArtifactStore(tmp_path / "a.git", remote="ssh://nobody@example.invalid/r.git")
    with pytest.raises(StorageUnavailable):
        store.fetch()
    session, group = (int(n) for n in seen.read_text().split())
    assert session != os.getsid(0) and group != os.getpgid(0)  # before: Reef's own session and group


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(record=False) as up:
        yield up


def skills_server(workdir: Path, upstream: ScriptedUpstream, **settings: object) -> ReefServer:
    return ReefServer(
        workdir,
        {
            "recipes": {"default": "skills"},
            "learner": {"enabled": False},
            "upstream": {"url": upstream.base_url, "model": "p", "timeout": 5},
            **settings,
        },
    )


def rollback(server: ReefServer, scenario: str, release_id: str) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    answer = httpx.post(f"{server.url}/reef/scenarios/{scenario}/rollback", json={"release_id": release_id}, timeout=30)
    return answer, time.monotonic() - start


def test_the_issues_reproduction_stop_lock_start_roll_back(tmp_path: Path, upstream: ScriptedUpstream) -> None:
    server = skills_server(tmp_path, upstream)
    with server:
        first = httpx.post(f"{server.url}/reef/scenarios", json={"name": "sc"}, timeout=10).json()["head"]["release_id"]
    lock = lock_of(server.state_dir / "artifacts.git", REF_PREFIX, "sc", age_s=5)
    with server:
        answer, took = rollback(server, "sc", first)
        assert answer.status_code == 200, answer.text  # before: 503 "cannot lock ref" after 5.8 s
        assert took < FAST_S
        assert not lock.exists()
        assert "removed a stale git lock" in server.logs()


# -- PostgreSQL and an artifact remote ---------------------------------------------------------


@pytest.fixture
def database(postgres_dsn: str) -> str:  # noqa: F811
    psycopg = pytest.importorskip("psycopg")
    name = f"reef_locks_{uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    parts = dict(item.split("=", 1) for item in postgres_dsn.split())
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{name}"


@pytest.mark.postgres
def test_a_front_end_on_postgresql_starts_and_publishes_despite_stale_locks(
    tmp_path: Path, upstream: ScriptedUpstream, database: str
) -> None:
    from reef.observe.postgres_store import PostgresStore

    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--bare", "--quiet", str(remote)], check=True)
    server = skills_server(tmp_path / "fe", upstream, store=database, artifacts={"remote": str(remote)})
    with server:
        first = httpx.post(f"{server.url}/reef/scenarios", json={"name": "sc"}, timeout=10).json()["head"]["release_id"]
    with ReefState.open(tmp_path / "other", store=PostgresStore(database), artifacts_remote=str(remote)) as other:
        moved = other.chain("sc").rollback(first, None).release_id  # another front end published meanwhile
    # a SIGKILL of `fe` mid-fetch and mid-push left these (the push's, on the remote, long ago)
    local = server.state_dir / "artifacts.git"
    locks = [
        lock_of(local, FETCHED_PREFIX, "sc"),
        lock_of(local, REF_PREFIX, "sc"),
        lock_of(remote, REF_PREFIX, "sc", age_s=git_locks.SHARED_AGE_S + 5),
    ]
    with server:  # before: exit 1 ("cannot lock ref" at the fetch of recovery), at every start
        answer, took = rollback(server, "sc", first)
        assert answer.status_code == 200, answer.text
        assert took < FAST_S
        release = answer.json()["release"]["release_id"]
        assert answer.json()["release"]["parent_release_id"] == moved
        assert git(remote, "rev-parse", f"{REF_PREFIX}{scenario_key('sc')}").strip() == release
        assert not any(lock.exists() for lock in locks)


# -- a git killed while it reads ---------------------------------------------------------------


def test_a_git_killed_while_it_reads_is_a_503_not_a_missing_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by bench/kill_loops.py: a rollback whose `git ls-tree` or `cat-file` was SIGKILLed
    answered 404 "release ... is not in the artifact store" (a failed read was taken for a missing
    release). Here a `git` on the PATH kills itself on `ls-tree` while a marker file exists."""
    real_git = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True, check=True).stdout.strip()
    bin_dir, mark = tmp_path / "bin", tmp_path / "kill-ls-tree"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(
        f'#!/bin/sh\nif [ "$1" = ls-tree ] && [ -e "{mark}" ]; then kill -9 $$; fi\nexec "{real_git}" "$@"\n'
    )
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with ReefState.open(tmp_path / "state") as state:
        release = state.create("s", recipe="skills").head().release_id
        mark.touch()
        with pytest.raises(StorageUnavailable, match="killed by signal 9"):
            state.artifacts.files(release)
        mark.unlink()
        assert state.artifacts.has_release(release)


@pytest.mark.postgres
def test_inspect_checks_a_front_end_on_postgresql(tmp_path: Path, database: str) -> None:
    """`reef inspect --store DSN --artifacts-remote R`: the commit logs from PostgreSQL, the releases
    another front end published fetched from the remote and checked, a stale lock removed."""
    from reef.observe.postgres_store import PostgresStore

    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--bare", "--quiet", str(remote)], check=True)
    with ReefState.open(tmp_path / "other", store=PostgresStore(database), artifacts_remote=str(remote)) as other:
        first = other.create("sc", "skills").head().release_id
        other.chain("sc").rollback(first, None)
    (tmp_path / "fe").mkdir()
    args = ["inspect", "--state-dir", str(tmp_path / "fe"), "--store", database, "--artifacts-remote", str(remote)]
    first_look = CliRunner().invoke(reef_cli, args)
    assert first_look.exit_code == 0, first_look.output
    assert "sc: step 2, head" in first_look.output
    lock = lock_of(tmp_path / "fe" / "artifacts.git", FETCHED_PREFIX, "sc", age_s=60)  # a fetch killed since
    again = CliRunner().invoke(reef_cli, args)
    assert again.exit_code == 0, again.output
    assert "removed a stale git lock" in again.output and not lock.exists()
    without_remote = CliRunner().invoke(
        reef_cli, ["inspect", "--state-dir", str(tmp_path / "new"), "--store", database]
    )
    assert without_remote.exit_code == 1  # no state directory there
