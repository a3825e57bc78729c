"""Property: any sequence of publish, reject, review/promote, rollback and advance calls, with
right or stale expectations, keeps steps strictly increasing, every head reachable in the log,
the serving pointer moving only forward, and a reopened state identical to the live one."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.errors import Conflict, InvalidInput
from reef.core.types import ArtifactKind, ReleaseRef, Verdict


def content(n: int) -> Candidate:
    return Candidate({"rules/r.md": f"rule {n}\n".encode()}, ArtifactKind.HARNESS)


class ChainMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="reef-prop-"))
        self.state = ReefState.open(self.dir)
        self.chain = self.state.create("p", "skills")
        self.heads_seen = [self.chain.head().release_id]
        self.serving_steps = [1]
        self.loads = 0

    def teardown(self) -> None:
        self.state.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def expected(self, stale: bool) -> str:
        return self.heads_seen[0] if stale and len(self.heads_seen) > 1 else self.chain.head().release_id

    def attempt(self, action) -> None:  # type: ignore[no-untyped-def]
        before = self.chain.history()
        try:
            action()
        except (Conflict, InvalidInput):
            assert self.chain.history() == before, "a refused call changed the log"
        self.heads_seen.append(self.chain.head().release_id)

    @rule(n=st.integers(0, 5), stale=st.booleans(), decision=st.sampled_from(["select", "review", "reject"]))
    def propose(self, n: int, stale: bool, decision: str) -> None:
        expected = self.expected(stale)
        if decision == "reject":
            self.attempt(lambda: self.chain.reject(content(n).content_id, expected, verdict=Verdict("reject")))
        else:
            self.attempt(lambda: self.chain.publish(content(n), expected, verdict=Verdict(decision)))

    @rule(pick=st.integers(0, 50), stale=st.booleans())
    def rollback(self, pick: int, stale: bool) -> None:
        releases = self.chain.releases()
        target = releases[pick % len(releases)].release_id
        self.attempt(lambda: self.chain.rollback(target, self.expected(stale)))

    @precondition(lambda self: any(r.pending for r in self.chain.releases()))
    @rule(pick=st.integers(0, 50))
    def promote(self, pick: int) -> None:
        pending = [r for r in self.chain.releases() if r.pending]
        self.attempt(lambda: self.chain.promote(pending[pick % len(pending)].release_id))

    @rule(pick=st.integers(0, 50), stale=st.booleans())
    def advance(self, pick: int, stale: bool) -> None:
        releases = self.chain.releases()
        target = releases[pick % len(releases)]
        self.loads += 1
        current = self.chain.serving().release_id
        expected = "0" * 40 if stale else current
        self.attempt(
            lambda: self.chain.advance(expected, ReleaseRef(target.release_id, target.content_id, f"l{self.loads}"))
        )
        self.serving_steps.append(self.chain.release(self.chain.serving().release_id).step)

    @invariant()
    def steps_strictly_increase(self) -> None:
        steps = [e.step for e in self.chain.history()]
        assert steps == list(range(1, len(steps) + 1))

    @invariant()
    def every_head_is_a_release_in_the_log(self) -> None:
        logged = {e.release.release_id for e in self.chain.history() if e.publishes_release}
        assert set(self.heads_seen) <= logged
        assert self.state.artifacts.scenario_head("p") == self.chain.releases()[0].release_id

    @invariant()
    def serving_moves_only_forward(self) -> None:
        assert self.serving_steps == sorted(self.serving_steps)

    @invariant()
    def reopening_gives_the_same_chain(self) -> None:
        with ReefState.open(self.dir) as again:
            assert again.chain("p").history() == self.chain.history()


ChainMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=12, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_release_chain_properties = ChainMachine.TestCase
