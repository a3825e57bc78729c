"""The release chain: creation binding, publish/rollback/promote by compare-and-swap, the
serving pointer, batches, compaction, recovery from the commit log. Tests on the `state`
fixture run on both commit-log backends (JSONL, PostgreSQL)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator
from uuid import uuid4

import pytest

from reef.commit.artifacts import ArtifactManifest, content_id_of
from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.errors import Conflict, InvalidInput, MissingArtifact, NotFound, StaleHead
from reef.core.types import ArtifactKind, Operation, Record, RecordStatus, ReleaseRef, Report, Verdict
from tests.pg import postgres_dsn  # noqa: F401  (session fixture used by the postgres params)

SELECT = Verdict("select", {"wins": 3})


def adapter(n: int) -> Candidate:
    return Candidate(
        {"adapter_config.json": b'{"r": 16}', "adapter_model.safetensors": bytes([n]) * 4096}, ArtifactKind.WEIGHTS
    )


@pytest.fixture(params=["jsonl", pytest.param("postgres", marks=pytest.mark.postgres)])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReefState]:
    """A state directory whose commit log is JSONL (SQLite store) or PostgreSQL (PostgreSQL
    store, a fresh schema): the chain behaves the same on either."""
    store = None
    if request.param == "postgres":
        from reef.observe.postgres_store import PostgresStore

        store = PostgresStore(request.getfixturevalue("postgres_dsn"), schema=f"t_{uuid4().hex[:12]}")
    with ReefState.open(tmp_path / "state", store=store) as st:
        yield st


def test_creation_binds_recipe_and_starting_release(state: ReefState) -> None:
    chain = state.create("math", "sao")
    head = chain.head()
    assert head.operation is Operation.CREATION and head.step == 1
    assert state.create("math", "sao").head() == head
    with pytest.raises(Conflict, match="recipe"):
        state.create("math", "skills")
    with pytest.raises(Conflict, match="starting_release_id"):
        state.create("math", "sao", starting_release=head.release_id)
    assert state.chain("math").last_step() == 1


def test_a_scenario_can_start_from_another_scenarios_release(state: ReefState) -> None:
    base = state.create("base", "sao")
    trained = base.publish(adapter(1), base.head().release_id, verdict=SELECT)
    fork = state.create("fork", "sao", starting_release=trained.release_id)
    assert fork.head().content_id == trained.content_id
    assert fork.head().parent_release_id == trained.release_id
    with pytest.raises(NotFound):
        state.create("ghost", "sao", starting_release="0" * 40)


def test_publish_moves_the_head_and_keeps_history(state: ReefState) -> None:
    chain = state.create("s", "sao")
    first = chain.head()
    r2 = chain.publish(adapter(2), first.release_id, verdict=SELECT, metrics={"loss": 0.5})
    assert chain.head() == r2 and r2.step == 2 and r2.parent_release_id == first.release_id
    assert r2.verdict == SELECT and r2.metrics["loss"] == 0.5
    assert state.artifacts.files(r2.release_id)["adapter_model.safetensors"] == bytes([2]) * 4096
    assert [r.step for r in chain.releases()] == [2, 1]


def test_publish_on_a_stale_parent_is_refused(state: ReefState) -> None:
    chain = state.create("s", "sao")
    parent = chain.head().release_id
    chain.publish(adapter(1), parent, verdict=SELECT)
    with pytest.raises(StaleHead):
        chain.publish(adapter(2), parent, verdict=SELECT)
    assert chain.last_step() == 2


def test_threads_racing_to_publish_on_one_parent_have_one_winner(state: ReefState) -> None:
    chain = state.create("s", "sao")
    parent = chain.head().release_id
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def contend(i: int) -> None:
        barrier.wait()
        try:
            chain.publish(adapter(10 + i), parent, verdict=SELECT)
            outcomes.append("won")
        except StaleHead:
            outcomes.append("stale")

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["stale"] * 5 + ["won"]
    assert chain.last_step() == 2
    assert state.artifacts.scenario_head("s") == chain.head().release_id


def test_rollback_republishes_old_content_as_a_new_release(state: ReefState) -> None:
    chain = state.create("s", "sao")
    r1 = chain.head()
    r2 = chain.publish(adapter(2), r1.release_id, verdict=SELECT)
    back = chain.rollback(r1.release_id, expected_head=r2.release_id)
    assert back.step == 3 and back.operation is Operation.ROLLBACK
    assert back.content_id == r1.content_id and back.release_id not in (r1.release_id, r2.release_id)
    assert back.parent_release_id == r2.release_id and back.rollback_target_release_id == r1.release_id
    assert [r.step for r in chain.releases()] == [3, 2, 1]
    with pytest.raises(StaleHead):
        chain.rollback(r2.release_id, expected_head=r2.release_id)


def test_rejection_is_logged_and_the_head_stays(state: ReefState) -> None:
    chain = state.create("s", "sao")
    head = chain.head()
    entry = chain.reject(adapter(3).content_id, head.release_id, verdict=Verdict("reject", {"margin": -0.2}))
    assert entry.operation is Operation.REJECTION and entry.metrics["candidate_content_id"] == adapter(3).content_id
    assert chain.head() == head and chain.last_step() == 2
    assert [r.step for r in chain.releases()] == [1]
    with pytest.raises(InvalidInput):
        chain.publish(adapter(3), head.release_id, verdict=Verdict("reject"))


def test_review_holds_a_release_until_promoted(state: ReefState) -> None:
    chain = state.create("s", "skills")
    head = chain.head()
    pending = chain.publish(adapter(4), head.release_id, verdict=Verdict("review"))
    assert pending.pending and chain.head() == head
    with pytest.raises(InvalidInput):
        chain.rollback(pending.release_id, head.release_id)
    promoted = chain.promote(pending.release_id)
    assert chain.head() == promoted and promoted.content_id == pending.content_id
    assert promoted.operation is Operation.PROMOTE and promoted.step == 3
    with pytest.raises(Conflict):
        chain.promote(pending.release_id)


def test_serving_pointer_advances_by_compare_and_swap_only_forward(state: ReefState) -> None:
    chain = state.create("s", "sao")
    r1 = chain.head()
    assert chain.serving() == r1.ref
    r2 = chain.publish(adapter(2), r1.release_id, verdict=SELECT)
    loaded = ReleaseRef(r2.release_id, r2.content_id, "load-7")
    assert chain.advance(r1.release_id, loaded) == loaded
    assert chain.serving().runtime_load_id == "load-7"
    with pytest.raises(StaleHead):
        chain.advance(r1.release_id, loaded)
    with pytest.raises(InvalidInput, match="forward"):
        chain.advance(r2.release_id, ReleaseRef(r1.release_id, r1.content_id, "load-8"))


def test_batches_are_logged_before_training_and_closed_explicitly(state: ReefState) -> None:
    chain = state.create("s", "sao")
    head = chain.head()
    chain.begin_batch("b1", ["rec1", "rec2"], ["rep1"], high_water=5, expected_step=1)
    assert chain.open_batch()["record_ids"] == ["rec1", "rec2"]
    assert chain.high_water() == 5
    with pytest.raises(Conflict, match="still open"):
        chain.begin_batch("b2", [], [], high_water=6, expected_step=2)
    chain.publish(adapter(1), head.release_id, verdict=SELECT, batch_id="b1", algorithm_state={"baseline": 0.4})
    assert chain.open_batch() is None and chain.algorithm_state() == {"baseline": 0.4}
    chain.begin_batch("b2", ["rec3"], ["rep2"], high_water=6, expected_step=3)
    chain.abandon_batch("b2", "restarted with an incompatible base model")
    assert chain.open_batch() is None
    assert chain.algorithm_state() == {"baseline": 0.4} and chain.high_water() == 6


def test_a_learner_may_keep_two_batches_open_and_close_them_in_any_order(state: ReefState) -> None:
    chain = state.create("s", "sao")
    head = chain.head()
    chain.begin_batch("b1", ["rec1"], ["rep1"], high_water=1, expected_step=1, max_open=2)
    chain.begin_batch("b2", ["rec2"], ["rep2"], high_water=2, expected_step=2, max_open=2)
    assert [b["batch_id"] for b in chain.open_batches()] == ["b1", "b2"] and chain.open_batch()["batch_id"] == "b1"
    with pytest.raises(Conflict, match="still open"):
        chain.begin_batch("b3", ["rec3"], ["rep3"], high_water=3, expected_step=3, max_open=2)
    with pytest.raises(Conflict, match="still open"):  # the default is one at a time
        chain.begin_batch("b3", ["rec3"], ["rep3"], high_water=3, expected_step=3)
    chain.abandon_batch("b2", "trained from a candidate the gate rejected")
    assert [b["batch_id"] for b in chain.open_batches()] == ["b1"]
    with pytest.raises(NotFound):
        chain.abandon_batch("b2", "twice")
    chain.reject("sha256:x", head.release_id, verdict=Verdict("reject"), batch_id="b1")
    assert chain.open_batches() == [] and chain.consumed_record_ids() == {"rec1"}


def test_a_batch_closes_once_and_a_record_is_in_one_batch_at_most(state: ReefState) -> None:
    """Invariant 9 under two learners that both believe they hold a scenario (a lease lost
    late): the second close of a batch and a second batch of the same record are refused."""
    chain = state.create("s", "sao")
    head = chain.head()
    chain.begin_batch("b1", ["rec1", "rec2"], ["rep1"], high_water=1, expected_step=1)
    chain.reject("sha256:x", head.release_id, verdict=Verdict("reject"), batch_id="b1")
    with pytest.raises(Conflict, match="already closed"):
        chain.publish(adapter(2), head.release_id, verdict=SELECT, batch_id="b1")
    with pytest.raises(Conflict, match="already in a logged batch: rec2"):
        chain.begin_batch("b2", ["rec2", "rec3"], ["rep2"], high_water=2, expected_step=chain.last_step())
    assert chain.head().release_id == head.release_id and chain.open_batches() == []


def test_compaction_deletes_only_consumed_records_and_is_logged(state: ReefState) -> None:
    chain = state.create("s", "sao")
    for rid in ("rec1", "rec2"):
        state.store.put_record(
            Record(
                id=rid,
                scenario="s",
                release=chain.head().ref,
                request={"q": rid},
                status=RecordStatus.COMPLETE,
                response={"a": 1},
            )
        )
    state.store.put_report(Report(id="rep1", scenario="s", references=("rec1",), score=1.0))
    with pytest.raises(InvalidInput, match="rec1"):
        chain.compact(state.store, ["rec1"])
    chain.begin_batch("b1", ["rec1"], ["rep1"], high_water=1, expected_step=1)
    chain.reject("sha256:x", chain.head().release_id, verdict=Verdict("reject"), batch_id="b1")
    entry = chain.compact(state.store, ["rec1"])
    assert entry.operation is Operation.COMPACTION and entry.compacted_ids == ("rec1",)
    with pytest.raises(NotFound):
        state.store.get_record("rec1")
    assert state.store.get_record("rec2").id == "rec2"


def test_reopening_rebuilds_heads_cursors_and_batches(tmp_path: Path) -> None:
    with ReefState.open(tmp_path) as st:
        chain = st.create("s", "sao")
        r2 = chain.publish(
            adapter(2), chain.head().release_id, verdict=SELECT, high_water=7, algorithm_state={"baseline": 0.1}
        )
        chain.begin_batch("b9", ["x"], ["y"], high_water=9, expected_step=2)
        st.create("other", "skills")
    with ReefState.open(tmp_path) as st:
        assert st.scenarios() == ["other", "s"]
        chain = st.chain("s")
        assert chain.head() == r2 and chain.high_water() == 9
        assert chain.algorithm_state() == {"baseline": 0.1}
        assert chain.open_batch()["batch_id"] == "b9"
        assert chain.binding == {"recipe": "sao", "starting_release_id": None}


def test_a_missing_artifact_is_named_on_open(tmp_path: Path) -> None:
    with ReefState.open(tmp_path) as st:
        chain = st.create("s", "sao")
        r2 = chain.publish(adapter(2), chain.head().release_id, verdict=SELECT)
    objects = list((tmp_path / "artifacts.git" / "lfs" / "objects").rglob("*"))
    for path in objects:
        if path.is_file():
            path.unlink()
    with pytest.raises(MissingArtifact, match=r2.release_id):
        ReefState.open(tmp_path)


def test_a_crash_between_artifact_and_log_line_is_repaired(tmp_path: Path) -> None:
    with ReefState.open(tmp_path) as st:
        chain = st.create("s", "sao")
        head = chain.head()
        # An artifact committed whose log line was never written: the git ref runs ahead.
        files = {"a.txt": b"x"}
        manifest = ArtifactManifest(content_id_of(files), head.release_id, "harness", {"kind": "training"}, {})
        orphan = st.artifacts.commit("s", files, manifest, expected_parent=head.release_id)
        assert st.artifacts.scenario_head("s") == orphan
    with ReefState.open(tmp_path) as st:
        assert st.artifacts.scenario_head("s") == head.release_id
        r2 = st.chain("s").publish(adapter(1), head.release_id, verdict=SELECT)
        assert st.artifacts.scenario_head("s") == r2.release_id


def _publish_from_process(root: str, parent: str, n: int, start, out) -> None:  # type: ignore[no-untyped-def]
    with ReefState.open(root) as st:
        start.wait()
        try:
            st.chain("s").publish(adapter(20 + n), parent, verdict=SELECT)
            out.put("won")
        except StaleHead:
            out.put("stale")


def test_processes_racing_to_publish_on_one_parent_have_one_winner(tmp_path: Path) -> None:
    import multiprocessing

    with ReefState.open(tmp_path) as st:
        parent = st.create("s", "sao").head().release_id
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_publish_from_process, args=(str(tmp_path), parent, i, start, out)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=60)
    assert sorted(out.get(timeout=5) for _ in procs) == ["stale", "stale", "stale", "won"]
    with ReefState.open(tmp_path) as st:
        chain = st.chain("s")
        assert chain.last_step() == 2 and chain.head().parent_release_id == parent
        assert st.artifacts.scenario_head("s") == chain.head().release_id
