"""Several front ends on one PostgreSQL commit log (issue 15, first part).

Each `ReefState` here is one front end: its own `PostgresStore` (its own connections) on one
schema of a throwaway cluster (tests/pg.py; skipped, saying why, without the binaries). Front
ends on one machine share the state directory (and so the artifacts); front ends with their own
state directories and no artifact remote cannot read each other's artifacts and must fail
naming what is missing (with a remote they fetch them: tests/test_deployment.py).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Iterator
from uuid import uuid4

import pytest

from reef.commit.commit_log import JsonlCommitLogs
from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.errors import MissingArtifact, StaleHead
from reef.core.types import ArtifactKind, Operation, Verdict
from tests.pg import postgres_dsn  # noqa: F401  (session fixture)

pytestmark = pytest.mark.postgres
SELECT = Verdict("select", {"wins": 3})
Open = Callable[[Path], ReefState]


def adapter(n: int) -> Candidate:
    return Candidate(
        {"adapter_config.json": b'{"r": 16}', "adapter_model.safetensors": n.to_bytes(4, "big") * 1024},
        ArtifactKind.WEIGHTS,
    )


@pytest.fixture
def front_end(postgres_dsn: str) -> Iterator[Open]:  # noqa: F811
    """Opens front ends (ReefState on a state directory) on one fresh PostgreSQL schema."""
    pytest.importorskip("psycopg")
    from reef.observe.postgres_store import PostgresStore

    schema = f"t_{uuid4().hex[:12]}"
    opened: list[ReefState] = []

    def open_(root: Path) -> ReefState:
        opened.append(ReefState.open(root, store=PostgresStore(postgres_dsn, schema=schema, pool_size=4)))
        return opened[-1]

    yield open_
    for state in opened:
        state.close()


def race(fronts: list[ReefState], attempt: Callable[[ReefState, int], object]) -> list[object]:
    """Run `attempt` on every front end at once; each one's result or exception, in order."""
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


def test_a_state_on_postgres_keeps_its_chain_in_the_database(front_end: Open, tmp_path: Path) -> None:
    state = front_end(tmp_path)
    chain = state.create("s", "sao")
    r2 = chain.publish(adapter(2), chain.head().release_id, verdict=SELECT, high_water=7, algorithm_state={"b": 0.1})
    chain.begin_batch("b9", ["x"], ["y"], high_water=9, expected_step=2)
    state.close()
    assert not list(tmp_path.glob("commits/*.jsonl"))  # the JSONL log stays the single-node default
    again = front_end(tmp_path)
    chain = again.chain("s")
    assert chain.head() == r2 and chain.high_water() == 9 and chain.algorithm_state() == {"b": 0.1}
    assert chain.open_batch()["batch_id"] == "b9"


def test_two_front_ends_publishing_at_once_have_one_winner_each_step(front_end: Open, tmp_path: Path) -> None:
    fronts = [front_end(tmp_path), front_end(tmp_path)]  # one machine: one state directory, one database
    created = race(fronts, lambda st, i: st.create("s", "sao").history()[0])
    assert created[0] == created[1] and created[0].operation is Operation.CREATION  # type: ignore[union-attr]
    winners: list[str] = []
    for round_ in range(6):
        heads = [st.chain("s").head().release_id for st in fronts]
        assert heads[0] == heads[1]
        results = race(fronts, lambda st, i: st.chain("s").publish(adapter(10 * round_ + i), heads[i], verdict=SELECT))
        won = [r for r in results if not isinstance(r, Exception)]
        lost = [r for r in results if isinstance(r, Exception)]
        assert len(won) == 1 and len(lost) == 1, results
        assert isinstance(lost[0], StaleHead)
        winners.append(won[0].release_id)  # type: ignore[attr-defined]
    history = fronts[0].chain("s").history()
    assert history == fronts[1].chain("s").history()
    assert [e.step for e in history] == list(range(1, 8))  # linear: one step per round, no gap, no fork
    assert [e.release.release_id for e in history[1:]] == winners
    for parent, child in zip(history, history[1:]):
        assert child.parent_release_id == parent.release.release_id
    assert fronts[0].artifacts.scenario_head("s") == winners[-1]


def test_two_front_ends_logging_batches_at_once_have_one_winner(front_end: Open, tmp_path: Path) -> None:
    fronts = [front_end(tmp_path), front_end(tmp_path)]
    fronts[0].create("s", "sao")
    fronts[1].create("s", "sao")
    results = race(
        fronts,
        lambda st, i: st.chain("s").begin_batch(f"b{i}", [f"r{i}"], [f"p{i}"], high_water=i + 1, expected_step=1),
    )
    assert sum(isinstance(r, StaleHead) for r in results) == 1
    assert len(fronts[1].chain("s").open_batches()) == 1


def test_a_front_end_without_a_releases_artifacts_names_what_is_missing(front_end: Open, tmp_path: Path) -> None:
    a, b = front_end(tmp_path / "a"), front_end(tmp_path / "b")  # two machines: own state directories
    base = a.create("s", "sao").head()
    chain_b = b.create("s", "sao")  # finds a's creation in the shared log
    assert chain_b.head() == base
    r2 = a.chain("s").publish(adapter(2), base.release_id, verdict=SELECT)
    with pytest.raises(StaleHead):
        chain_b.publish(adapter(3), base.release_id, verdict=SELECT)
    with pytest.raises(MissingArtifact, match=r2.release_id):  # b cannot build on a release it cannot read
        chain_b.publish(adapter(3), r2.release_id, verdict=SELECT)
    with pytest.raises(MissingArtifact, match=r2.release_id):
        b.artifacts.files(chain_b.head().release_id)
    assert [e.step for e in chain_b.history()] == [1, 2]  # nothing was logged by the failures
    with pytest.raises(MissingArtifact, match=rf"scenario 's': release {r2.release_id}.*every front end"):
        front_end(tmp_path / "b")  # a restart refuses to serve a head it cannot read


def test_missing_lfs_objects_are_named_on_open(front_end: Open, tmp_path: Path) -> None:
    state = front_end(tmp_path)
    chain = state.create("s", "sao")
    r2 = chain.publish(adapter(2), chain.head().release_id, verdict=SELECT)
    oid = adapter(2).files["adapter_model.safetensors"]
    for path in (tmp_path / "artifacts.git" / "lfs" / "objects").rglob("*"):
        if path.is_file():
            path.unlink()
    with pytest.raises(
        MissingArtifact,
        match=rf"release {r2.release_id}: LFS object [0-9a-f]{{64}} for "
        r"'adapter_model.safetensors' is missing",
    ) as info:
        front_end(tmp_path)
    assert oid and "every front end" in str(info.value)


def test_a_state_directorys_jsonl_logs_are_imported_once(front_end: Open, tmp_path: Path) -> None:
    with ReefState.open(tmp_path) as local:  # single node: SQLite store, JSONL log
        chain = local.create("s", "sao")
        chain.publish(adapter(1), chain.head().release_id, verdict=SELECT)
        before = chain.history()
    state = front_end(tmp_path)
    assert state.chain("s").history() == before
    state.chain("s").rollback(before[0].release.release_id, expected_head=before[-1].release.release_id)
    state.close()
    assert len(JsonlCommitLogs(tmp_path / "commits").open("s").entries()) == 2  # left as it was
    assert [e.step for e in front_end(tmp_path).chain("s").history()] == [1, 2, 3]  # not imported again
