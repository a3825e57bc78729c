"""The harness learner of one scenario: reported records in, candidate harness trees out.

One loop, in a fixed, visible order: read new reports since the cursor and let the `skills`
recipe sort them into waiting failures, successes and held-out tasks; when the proposer says a
batch is ready, log it (invariant 9, before proposing), ask the proposer for mutations of the
head's tree, and hand the candidate tree to the publisher (the harness gate, then publish,
hold for review or reject, which closes the batch in the log). A proposer that gives nothing
usable (invalid output after its tries, no recurring theme) closes the batch as abandoned with
its reason, which the learner status counts. On start, a batch the log shows open is proposed
again from its records if they are all still there, and abandoned (logged) otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from reef.core.canonical import new_id
from reef.core.errors import InvalidInput, NotFound, StaleHead
from reef.core.types import CommitEntry, Operation, Release, ReleaseRef, ReportedRecords, Verdict
from reef.grow.learner import Chain
from reef.grow.loop import keep_stepping
from reef.observe.store import ExperienceStore
from reef.recipes.skills import Batch, Observation, ProposalFailed, SkillsRecipe, feedback_text, observation_of
from reef.surfaces.harness import HarnessTree, Mutation

log = logging.getLogger("reef.harness_learner")
LAST_FAILURES = 5


@dataclass
class HarnessCandidate:
    scenario: str
    batch_id: str
    base: Release  # the head the candidate was made from (and is judged against)
    base_files: dict[str, bytes]
    base_tree: HarnessTree
    tree: HarnessTree
    mutations: tuple[Mutation, ...]
    notes: dict[str, Any]
    high_water: int
    held_out: list[dict[str, Any]]
    algorithm_state: dict[str, Any]


class HarnessChain(Chain, Protocol):
    def history(self) -> list[CommitEntry]: ...
    def serving(self) -> ReleaseRef: ...


Decide = Callable[[HarnessCandidate], Awaitable[Verdict]]
HeadHarness = Callable[[], Awaitable[tuple[Release, dict[str, bytes], HarnessTree]]]


@dataclass
class HarnessLearnerStats:
    state: str = "starting"
    waiting_failures: int = 0
    waiting_successes: int = 0
    held_out: int = 0
    batches: int = 0
    candidates: int = 0
    published: int = 0
    review: int = 0
    rejected: int = 0
    abandoned: int = 0
    proposer_failures: Counter[str] = field(default_factory=Counter)
    last_proposer_failures: deque[str] = field(default_factory=lambda: deque(maxlen=LAST_FAILURES))
    dropped: Counter[str] = field(default_factory=Counter)
    last_verdict: dict[str, Any] | None = None
    last_error: str | None = None


class HarnessLearner:
    def __init__(self, chain: HarnessChain, store: ExperienceStore, recipe: SkillsRecipe, decide: Decide,
                 head_harness: HeadHarness, poll_interval: float = 0.5) -> None:
        self.chain = chain
        self.scenario = chain.scenario
        self.store = store
        self.recipe = recipe
        self.decide = decide
        self.head_harness = head_harness
        self.poll_interval = poll_interval
        self.stats = HarnessLearnerStats()
        self.held_out: deque[Observation] = deque(maxlen=recipe.config.gate.max_holdout)
        self.cursor = chain.high_water()
        self.used = batched_record_ids(chain)

    async def run(self) -> None:
        await self.recover()
        await keep_stepping(f"harness learner {self.scenario}", self.step, self.stats, self.poll_interval)

    async def recover(self) -> None:
        """Propose again for the batch the log shows open, or abandon it (logged)."""
        batch = self.chain.open_batch()
        if batch is None:
            return
        try:
            observations = [self._reread(rid) for rid in batch["record_ids"]]
        except NotFound as exc:
            await self._abandon(batch["batch_id"], "restart", f"cannot resume after restart: {exc}", proposer=False)
            return
        failures = tuple(o for o in observations if o.score < self.recipe.config.failure_below)
        successes = tuple(o for o in observations if o.score >= self.recipe.config.failure_below)
        log.info("harness learner %s: resuming batch %s after a restart", self.scenario, batch["batch_id"])
        await self._propose(Batch(failures, successes), batch["batch_id"], int(batch.get("high_water", self.cursor)))

    async def step(self) -> bool:
        """Take in new reports; propose and judge a candidate when a batch is ready."""
        items = self.store.reported_since(self.scenario, self.cursor, limit=512)
        if items:
            intake = self.recipe.intake(items, self.used)
            self.cursor = items[-1].cursor
            self.held_out.extend(intake.held_out)
            self.stats.dropped.update(intake.dropped)
            self.stats.dropped.update(self.recipe.take(intake))
        _, _, tree = await self.head_harness()
        batch = self.recipe.next_batch(tree)
        self._count_waiting()
        if batch is None:
            self.stats.state = "collecting"
            return bool(items)
        low = self.recipe.waiting_low_seq()
        high_water = low - 1 if low is not None else self.cursor
        batch_id = new_id()
        self.stats.state = "logging batch"
        await asyncio.to_thread(self.chain.begin_batch, batch_id, batch.record_ids, batch.report_ids,
                                high_water=high_water, expected_step=self.chain.last_step())
        self.used.update(batch.record_ids)
        self.stats.batches += 1
        try:
            await self._propose(batch, batch_id, high_water)
        except Exception as exc:  # a scorer or runtime error: close the batch, or the next one cannot open
            if (self.chain.open_batch() or {}).get("batch_id") == batch_id:
                await self._abandon(batch_id, "error", f"{type(exc).__name__}: {exc}", proposer=False)
            raise
        return True

    async def _propose(self, batch: Batch, batch_id: str, high_water: int) -> None:
        base, base_files, tree = await self.head_harness()
        self.stats.state = "proposing"
        try:
            proposal = await self.recipe.proposer.propose(tree, batch, self.chain.serving())
            candidate_tree = tree.apply(proposal.mutations)
        except ProposalFailed as exc:
            await self._abandon(batch_id, exc.kind, exc.reason)
            return
        except InvalidInput as exc:
            await self._abandon(batch_id, "invalid_mutation", f"the proposal does not fit the tree: {exc}")
            return
        if candidate_tree.content_id == tree.content_id:
            await self._abandon(batch_id, "no_change", "the proposal leaves the harness as it is")
            return
        state = dict(self.chain.algorithm_state() or {})
        state.update(recipe=self.recipe.name, candidates=int(state.get("candidates", 0)) + 1)
        candidate = HarnessCandidate(self.scenario, batch_id, base, base_files, tree, candidate_tree,
                                     proposal.mutations, proposal.notes, high_water,
                                     [o.as_task() for o in self.held_out], state)
        self.stats.state, self.stats.candidates = "evaluating", self.stats.candidates + 1
        try:
            verdict = await self.decide(candidate)
        except StaleHead as exc:  # a rollback or promote moved the head while the gate ran
            await self._abandon(batch_id, "head_moved", f"the head moved during evaluation: {exc}", proposer=False)
            return
        self.stats.last_verdict = {"decision": verdict.decision,
                                   **{k: v for k, v in verdict.metrics.items() if k != "per_task"}}
        if verdict.decision == "select":
            self.stats.published += 1
        elif verdict.decision == "review":
            self.stats.review += 1
        else:
            self.stats.rejected += 1
        self.stats.state = "collecting"

    async def _abandon(self, batch_id: str, kind: str, reason: str, proposer: bool = True) -> None:
        log.warning("harness learner %s: batch %s skipped (%s): %s", self.scenario, batch_id, kind, reason)
        await asyncio.to_thread(self.chain.abandon_batch, batch_id, f"{kind}: {reason}")
        self.stats.abandoned += 1
        if proposer:
            self.stats.proposer_failures[kind] += 1
            self.stats.last_proposer_failures.append(f"{kind}: {reason}"[:500])
        self.stats.state = "collecting"

    def _reread(self, record_id: str) -> Observation:
        """Rebuild an observation of a logged batch from the store (its record and latest report)."""
        record = self.store.get_record(record_id)
        reports = self.store.reports_for(record_id)
        if not reports:
            raise NotFound(f"record {record_id} has no report")
        report = reports[-1]
        return observation_of(record, ReportedRecords(report, (record,)), feedback_text(report.feedback))

    def _count_waiting(self) -> None:
        s = self.stats
        s.waiting_failures, s.waiting_successes = len(self.recipe.failures), len(self.recipe.successes)
        s.held_out = len(self.held_out)

    def status(self) -> dict[str, Any]:
        s = self.stats
        return {"scenario": self.scenario, "recipe": self.recipe.name, "proposer": self.recipe.proposer.name,
                "state": s.state, "cursor": self.cursor, "waiting_failures": s.waiting_failures,
                "waiting_successes": s.waiting_successes, "held_out": s.held_out, "batches": s.batches,
                "candidates": s.candidates, "published": s.published, "pending_review": s.review,
                "rejected": s.rejected, "abandoned": s.abandoned, "proposer_failures": dict(s.proposer_failures),
                "last_proposer_failures": list(s.last_proposer_failures), "dropped": dict(s.dropped),
                "last_verdict": s.last_verdict, "last_error": s.last_error}


def batched_record_ids(chain: HarnessChain) -> set[str]:
    """Every record a logged batch named, however the batch ended: none is used twice."""
    return {rid for entry in chain.history() if entry.operation is Operation.BATCH and entry.batch
            for rid in entry.batch["record_ids"]}
