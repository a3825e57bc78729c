"""Several front ends on one PostgreSQL database and one artifact remote (issue 15, part 2).

Each front end has its OWN state directory; they share the database (records, reports, the
commit log) and a bare git repository (the artifact remote). In-process front ends
(`ReefState`) check the artifact store's rules: a release published on one is fetched by
another, objects the remote lacks are named, a racing publish has one winner per step, a
publish that died between its push and its log step is replaced. Three `reef serve` processes
(upstream runtime in front of tests/scripted_upstream.py, recipe `skills`, learner off, so
rollbacks publish releases cheaply) check the deployment: a receipt from any front end is
reported on any other, a rollback on one is served by all three within 2 s, two front ends
rolling back at once get one winner per step. Skipped, saying why, without PostgreSQL.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterator
from uuid import uuid4

import httpx
import pytest

from reef.commit.artifacts import LFS_REF_PREFIX, ArtifactManifest
from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.errors import MissingArtifact, StaleHead
from reef.core.types import ArtifactKind, Verdict
from tests.helpers.reef_server import ReefServer
from tests.pg import postgres_dsn  # noqa: F401  (session fixture)
from tests.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.postgres
SELECT = Verdict("select", {"wins": 3})
FOLLOW_WITHIN_S = 2.0
Open = Callable[[Path], ReefState]


def adapter(n: int) -> Candidate:
    return Candidate(
        {"adapter_config.json": b'{"r": 16}', "adapter_model.safetensors": n.to_bytes(4, "big") * 1024},
        ArtifactKind.WEIGHTS,
    )


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    path = tmp_path / "remote.git"
    subprocess.run(["git", "init", "--bare", "--quiet", str(path)], check=True)
    return path


@pytest.fixture
def front_end(postgres_dsn: str, remote: Path) -> Iterator[Open]:  # noqa: F811
    """Opens front ends (ReefState on their own state directory) on one fresh PostgreSQL schema
    and one artifact remote."""
    pytest.importorskip("psycopg")
    from reef.observe.postgres_store import PostgresStore

    schema = f"t_{uuid4().hex[:12]}"
    opened: list[ReefState] = []

    def open_(root: Path) -> ReefState:
        store = PostgresStore(postgres_dsn, schema=schema, pool_size=4)
        opened.append(ReefState.open(root, store=store, artifacts_remote=str(remote)))
        return opened[-1]

    yield open_
    for state in opened:
        state.close()


def race(fronts: list[ReefState], attempt: Callable[[ReefState, int], object]) -> list[object]:
    results: list[object] = [None] * len(fronts)
    barrier = threading.Barrier(len(fronts))

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = attempt(fronts[i], i)
        except Exception as exc:  # noqa: BLE001
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fronts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


# -- the shared artifact store, in process -------------------------------------------------------


def test_a_release_published_on_one_front_end_is_fetched_by_another(
    front_end: Open, tmp_path: Path, remote: Path
) -> None:
    a, b = front_end(tmp_path / "a"), front_end(tmp_path / "b")
    base = a.create("s", "sao").head()
    r2 = a.chain("s").publish(adapter(2), base.release_id, verdict=SELECT)
    assert git(remote, "rev-parse", "refs/reef/scenarios/cw").strip() == r2.release_id  # pushed before logged
    assert git(remote, "for-each-ref", "--format=%(objecttype)", LFS_REF_PREFIX).split() == ["blob"]
    chain_b = b.create("s", "sao")
    assert b.artifacts.files(chain_b.head().release_id) == adapter(2).files  # fetched: commit and LFS bytes
    r3 = chain_b.publish(adapter(3), r2.release_id, verdict=SELECT)  # b builds on a's release
    assert a.artifacts.files(r3.release_id) == adapter(3).files
    r4 = a.chain("s").rollback(base.release_id, expected_head=r3.release_id)
    assert b.artifacts.files(r4.release_id) == {}
    assert front_end(tmp_path / "c").chain("s").head() == r4  # a new front end opens on the head, fetched


def test_objects_the_remote_lacks_too_are_named(front_end: Open, tmp_path: Path, remote: Path) -> None:
    a, b = front_end(tmp_path / "a"), front_end(tmp_path / "b")
    r2 = a.create("s", "sao").publish(adapter(2), a.chain("s").head().release_id, verdict=SELECT)
    (ref,) = git(remote, "for-each-ref", "--format=%(refname)", LFS_REF_PREFIX).split()
    git(remote, "update-ref", "-d", ref)
    oid = ref.rsplit("/", 1)[1]
    with pytest.raises(
        MissingArtifact,
        match=rf"release {r2.release_id}: LFS object {oid} for "
        rf"'adapter_model.safetensors' is missing .* nor on the artifact remote",
    ):
        b.artifacts.files(r2.release_id)
    with pytest.raises(MissingArtifact, match="nor on the artifact remote"):
        b.artifacts.files("0" * 40)


def test_front_ends_publishing_at_once_have_one_winner_each_step(front_end: Open, tmp_path: Path, remote: Path) -> None:
    fronts = [front_end(tmp_path / "a"), front_end(tmp_path / "b")]  # two machines
    created = race(fronts, lambda st, i: st.create("s", "sao").history()[0])
    assert created[0] == created[1]
    winners = []
    for round_ in range(4):
        head = fronts[0].chain("s").head().release_id
        results = race(fronts, lambda st, i: st.chain("s").publish(adapter(10 * round_ + i), head, verdict=SELECT))
        won = [r for r in results if not isinstance(r, Exception)]
        assert len(won) == 1 and sum(isinstance(r, StaleHead) for r in results) == 1, results
        winners.append(won[0].release_id)  # type: ignore[attr-defined]
    history = fronts[1].chain("s").history()
    assert [e.step for e in history] == [1, 2, 3, 4, 5]
    assert [e.release.release_id for e in history[1:]] == winners
    assert git(remote, "rev-list", "--first-parent", "refs/reef/scenarios/cw").split()[:4] == winners[::-1]
    for state in fronts:
        assert state.artifacts.files(winners[-1]) == state.artifacts.files(history[-1].release.release_id)


def test_a_publish_that_died_between_push_and_log_is_replaced(front_end: Open, tmp_path: Path, remote: Path) -> None:
    a, b = front_end(tmp_path / "a"), front_end(tmp_path / "b")
    head = a.create("s", "sao").head()
    candidate = adapter(7)
    manifest = ArtifactManifest(candidate.content_id, head.release_id, "weights")
    orphan = a.artifacts.commit("s", candidate.files, manifest, expected_parent=head.release_id)  # pushed, never logged
    assert git(remote, "rev-parse", "refs/reef/scenarios/cw").strip() == orphan
    b.create("s", "sao")
    r2 = b.chain("s").publish(adapter(8), head.release_id, verdict=SELECT)
    assert git(remote, "rev-parse", "refs/reef/scenarios/cw").strip() == r2.release_id
    assert [r.release_id for r in a.chain("s").releases()] == [r2.release_id, head.release_id]


def test_a_commit_notifies_listening_front_ends(front_end: Open, tmp_path: Path) -> None:
    a, b = front_end(tmp_path / "a"), front_end(tmp_path / "b")
    a.create("s", "sao")
    watch = b.commit_logs.watch()  # type: ignore[attr-defined]
    try:
        assert watch.wait(1.0)  # connected: the caller looks once
        assert not watch.wait(0.2)  # nothing committed
        start = time.monotonic()
        a.chain("s").rollback(a.chain("s").head().release_id, expected_head=None)
        assert watch.wait(5.0) and time.monotonic() - start < 1.0
        assert b.commit_logs.heads() == {"s": 2}  # type: ignore[attr-defined]
    finally:
        watch.close()


# -- three `reef serve` processes ----------------------------------------------------------------


@pytest.fixture(scope="module")
def deployment(postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ReefServer]]:  # noqa: F811
    psycopg = pytest.importorskip("psycopg")
    database = f"reef_deploy_{uuid4().hex[:10]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    parts = dict(item.split("=", 1) for item in postgres_dsn.split())
    store = f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{database}"
    root = tmp_path_factory.mktemp("deployment")
    remote = root / "remote.git"
    subprocess.run(["git", "init", "--bare", "--quiet", str(remote)], check=True)
    with ScriptedUpstream(record=False) as upstream:
        servers = []
        for name in ("fe0", "fe1", "fe2"):
            settings = {
                "state_dir": str(root / name / "state"),
                "store": store,
                "artifacts": {"remote": str(remote)},
                "recipes": {"default": "skills"},
                "learner": {"enabled": False},
                "upstream": {"url": upstream.base_url, "model": "p", "timeout": 5},
            }
            servers.append(ReefServer(root / name, settings))
        threads = [threading.Thread(target=s.start) for s in servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        try:
            for s in servers:
                assert s.process is not None and s.process.poll() is None, s.logs()
            yield servers
        finally:
            for s in servers:
                s.stop()


def ask(server: ReefServer, scenario: str) -> httpx.Response:
    response = httpx.post(
        f"{server.base_url}/chat/completions",
        headers={"x-reef-scenario": scenario},
        timeout=10,
        json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
    )
    assert response.status_code == 200, response.text
    return response


def served_by_all_within(servers: list[ReefServer], scenario: str, release_id: str) -> float:
    """Seconds until every front end's responses carry `release_id`; fails past FOLLOW_WITHIN_S."""
    start = time.monotonic()
    waiting = list(servers)
    while waiting:
        waiting = [s for s in waiting if ask(s, scenario).headers["x-reef-release-id"] != release_id]
        elapsed = time.monotonic() - start
        assert elapsed < FOLLOW_WITHIN_S or not waiting, (
            f"{[s.port for s in waiting]} still serve another release after {elapsed:.2f} s"
        )
        if waiting:
            time.sleep(0.05)
    return time.monotonic() - start


def test_a_receipt_from_any_front_end_is_reported_on_any_other(deployment: list[ReefServer]) -> None:
    for i, server in enumerate(deployment):
        receipt = ask(server, "receipts").headers["x-reef-agent-record-id"]
        reporter, reader = deployment[(i + 1) % 3], deployment[(i + 2) % 3]
        report = httpx.post(f"{reporter.url}/reef/report", json={"references": [receipt], "score": 1.0}, timeout=10)
        assert report.status_code == 200, report.text
        got = httpx.get(f"{reader.url}/reef/records/{receipt}", timeout=10).json()
        assert [r["id"] for r in got["reports"]] == [report.json()["report_id"]]


def test_a_rollback_on_one_front_end_is_served_by_all_within_2_s(deployment: list[ReefServer]) -> None:
    created = httpx.post(f"{deployment[0].url}/reef/scenarios", json={"name": "follow"}, timeout=10)
    assert created.status_code == 201, created.text
    first = created.json()["head"]["release_id"]
    served_by_all_within(deployment, "follow", first)  # created on fe0, known to all
    for server in (deployment[1], deployment[2], deployment[0]):
        rolled = httpx.post(f"{server.url}/reef/scenarios/follow/rollback", json={"release_id": first}, timeout=10)
        assert rolled.status_code == 200, rolled.text
        release = rolled.json()["release"]["release_id"]
        took = served_by_all_within(deployment, "follow", release)
        print(f"rollback on :{server.port} served by all three in {took:.3f} s")
        assert took < FOLLOW_WITHIN_S
    steps = [r["step"] for r in httpx.get(f"{deployment[2].url}/reef/scenarios/follow/releases").json()["releases"]]
    assert steps == [4, 3, 2, 1]


def test_two_front_ends_rolling_back_at_once_have_one_winner_each_step(deployment: list[ReefServer]) -> None:
    created = httpx.post(f"{deployment[1].url}/reef/scenarios", json={"name": "race"}, timeout=10).json()
    first = created["head"]["release_id"]
    head, winners = first, []
    for _ in range(4):
        results: list[httpx.Response | None] = [None, None]

        def roll(i: int, barrier: threading.Barrier) -> None:
            barrier.wait()
            results[i] = httpx.post(
                f"{deployment[i].url}/reef/scenarios/race/rollback",
                timeout=30,
                json={"release_id": first, "expected_head": head},
            )

        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=roll, args=(i, barrier)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        codes = sorted(r.status_code for r in results if r is not None)
        assert codes == [200, 409], [r.text for r in results if r is not None]
        won = next(r for r in results if r is not None and r.status_code == 200)
        head = won.json()["release"]["release_id"]
        winners.append(head)
    releases = httpx.get(f"{deployment[2].url}/reef/scenarios/race/releases", timeout=10).json()["releases"]
    assert [r["release_id"] for r in releases] == [*winners[::-1], first]  # linear: one step per round
    assert [r["step"] for r in releases] == [5, 4, 3, 2, 1]
    served_by_all_within(deployment, "race", winners[-1])
