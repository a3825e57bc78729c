"""The learner of one scenario, the same loop for every recipe: reported records in, candidates out.

The first of three loops (docs/architecture.md): intake and training here, judging in the gate's
lane (`reef.commit.gate_lane`), the canary in `reef.grow.canary.CanaryLoop`. Each step: read new
reports since the cursor, show them to the canary, let the recipe take them in (or count why
not); once it has a batch, log it (invariant 9, before any work), let it make a candidate (train
through the primitives, or propose a harness change; a span `reef.learn`) and hand it on. A
weights candidate goes to the canary and the lane's one-place queue, and training goes on from
it (at most three batches open: at the gate, waiting, in training); a harness candidate is made
from the head and judged against exactly that head, here. No candidate: the batch is abandoned
with its reason. Each outcome comes back to `settle`, which keeps or drops the line being trained
(`reef.grow.working_line`); a rollback or promote stops the canary at once (`head_moved`, by the
route on this front end, or seen at the next step on another's). On start, the batches the log
shows open are resumed in order if their records are all still there, abandoned (logged)
otherwise. Serving never waits on any of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

from reef.commit.gate_lane import GateLane, Outcome, Queued
from reef.core.canonical import new_id
from reef.core.errors import NotFound, StaleHead
from reef.core.learned import LearnedCandidate
from reef.core.training import checkpoint_part
from reef.grow.canary import CanaryLoop
from reef.grow.chain_view import Chain, ChainView, HeadFiles, batched_record_ids, reported_record
from reef.grow.learner_stats import LearnerStats, SampleWait
from reef.grow.learner_status import learner_status
from reef.grow.loop import keep_stepping
from reef.grow.recipe import Abandon, Batch, Job, LearnerView, Recipe
from reef.grow.steering import Steering
from reef.grow.training_client import TrainingClient
from reef.grow.working_line import WorkingLine
from reef.observe import spans
from reef.observe.store import ExperienceStore

log = logging.getLogger("reef.learner")
WORKING_STATE = {"weights": "training", "harness": "proposing"}
# The gate answers ahead of the first candidate once the learner has waited this long for samples
# (thin traffic; bench/first_verdict.py): answering at once would slow faster traffic's first batches.
ANSWER_AHEAD_AFTER_S = 15.0


class Learner:
    """The intake and training loop. Its gate's lane and canary loop come built (`reef.serve.learning`
    wires the three); `stats` is the one the canary loop also writes its failures to."""

    def __init__(
        self,
        chain: Chain,
        store: ExperienceStore,
        recipe: Recipe,
        head_files: HeadFiles,
        lane: GateLane,
        canary: CanaryLoop,
        stats: LearnerStats,
        trainer: TrainingClient | None = None,
        *,
        poll_interval: float = 0.5,
        answer_ahead_after: float = ANSWER_AHEAD_AFTER_S,
    ) -> None:
        self.chain, self.scenario, self.store, self.recipe = chain, chain.scenario, store, recipe
        self.reader, self.trainer, self.poll_interval = ChainView(chain, head_files), trainer, poll_interval
        self.answer_ahead_after = answer_ahead_after
        self.pipelined = recipe.surface == "weights"
        self.stats, self.lane, self.canary = stats, lane, canary
        self.lane.line = self
        self.steering = Steering(recipe, self.canary)  # training mode and live settings, from the log
        self.wait = SampleWait(idle_since=time.monotonic())  # waiting for samples from the start
        self.cursor = chain.high_water()
        self.consumed = batched_record_ids(chain)
        self.algorithm_state = dict(chain.algorithm_state() or {})  # ahead of the log while a candidate is judged
        self.view = LearnerView(
            self.scenario,
            self.consumed,
            self._staleness_of,
            chain.head,
            self.reader.head_files,
            self.stats.dropped,
            store,
        )
        self.line = WorkingLine(chain.head().release_id)  # the line being trained

    # the lane's and the canary's state, as the learner's tests and status read it
    waiting = property(lambda self: self.lane.waiting)
    at_gate = property(lambda self: self.lane.at_gate)
    judging = property(lambda self: self.lane.judging)
    live = property(lambda self: self.canary.live)
    # the working line, as the lane (its `Line`) and the tests read it
    working = property(lambda self: self.line.files)
    lineage = property(lambda self: self.line.lineage)
    line_published = property(lambda self: self.line.published)
    drop_reason = property(lambda self: self.line.drop_reason)

    def _gate_idle(self) -> bool:
        return self.lane.idle()

    async def run(self) -> None:
        try:
            await self.recover()
            await keep_stepping(f"learner {self.scenario}", self.step, self.stats, self.poll_interval)
        finally:
            self.lane.cancel()

    async def recover(self) -> None:
        """Resume the batches the log shows open, oldest first, or abandon them (logged)."""
        for logged in self.chain.open_batches():
            batch_id = logged["batch_id"]
            try:
                batch = self.recipe.resume([reported_record(self.store, rid) for rid in logged["record_ids"]])
            except NotFound as exc:
                await self.abandon(batch_id, f"cannot resume after restart: {exc}")
                continue
            log.info("learner %s: resuming batch %s after a restart", self.scenario, batch_id)
            try:
                await self._make(batch, batch_id, int(logged.get("high_water", self.cursor)), logged=True)
            except Exception as exc:  # noqa: BLE001 - abandoned by _make; the next batch and learning go on
                log.exception("learner %s: resuming batch %s failed", self.scenario, batch_id)
                self.failed(exc)
        await self.lane.drain()

    async def step(self) -> bool:
        """Take in new reports; make a candidate when the recipe has a batch. True if it did work."""
        if self.lane.judging is not None and self.lane.judging.done():
            await self.lane.drain()
        if self._line_outrun():  # a rollback or promote on another front end (this one's calls head_moved)
            await self.head_moved()
        items = self.store.reported_since(self.scenario, self.cursor, limit=512)
        if items:
            await self.canary.watch(items, self.chain.serving().release_id)
            self.recipe.intake(items, self.view)
            self.cursor = items[-1].cursor
        self.steering.refresh(self.chain.history())
        self.view.from_traffic = self.steering.from_traffic()
        batch = await self.recipe.next_batch(self.view) if self.steering.may_ask() else None
        if batch is None:
            now = time.monotonic()
            if self.wait.longer_than_making(now):  # the traffic lags: a held candidate goes to the gate
                await self.lane.unhold()
            waited = self.wait.first_wait(now)
            if self.lane.may_answer_ahead() and waited is not None and waited >= self.answer_ahead_after:
                await self.lane.answer_ahead()
            self.stats.state = "collecting" if self.lane.at_gate is None else "evaluating"  # not answering ahead
            return bool(items)
        started = time.monotonic()
        await self._make(batch, new_id(), self.recipe.high_water(self.cursor), logged=False)
        self.wait.made(started, time.monotonic())
        return True

    async def _make(self, batch: Batch, batch_id: str, high_water: int, logged: bool) -> None:
        """Make a candidate of `batch` and hand it on: a weights candidate to the canary and the
        gate's lane, while the next trains on from it; a harness candidate to the gate, here."""
        if not logged:
            self.stats.state = "logging batch"
            await asyncio.to_thread(
                self.chain.begin_batch,
                batch_id,
                batch.record_ids,
                batch.report_ids,
                high_water=high_water,
                expected_step=self.chain.last_step(),
                max_open=3 if self.pipelined else 1,
            )
        self.consumed.update(batch.record_ids)
        self.stats.batches += 1
        if self._line_outrun():  # a rollback or promote: this batch trains from the new head
            await self.head_moved()
        lineage = self.line.lineage
        job = await self._job(batch_id)
        self.stats.state = WORKING_STATE[self.recipe.surface]
        attributes = {"reef.surface": self.recipe.surface, "reef.batch.records": len(batch.record_ids)}
        try:
            with spans.span(
                "reef.learn", spans.batch_scope(self.scenario, self.recipe.name, batch_id, attributes), ok=(Abandon,)
            ):
                made = await self.recipe.candidate(batch, job)
        except Abandon as exc:
            await self.abandon(batch_id, f"{exc.kind}: {exc.reason}")
            return
        except Exception as exc:
            await self.abandon(batch_id, f"{self.stats.state} failed: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.algorithm_state = job.algorithm_state
        if self.pipelined and self._line_outrun():  # the head moved while it trained: its line is void
            await self.head_moved()
        if lineage != self.line.lineage:  # the candidate it trained on from was dropped meanwhile
            await self.abandon(batch_id, f"trained on from a candidate that was dropped: {self.line.drop_reason}")
            return
        self.line.extend(made.files)
        self.stats.candidates += 1
        candidate = job.candidate(made, self.recipe.name, high_water, self.steering.gate_overrides)
        if not self.pipelined:
            await self.settle(await self.lane.judge(candidate))
            self.stats.state = "collecting"
            return
        await self.lane.offer((candidate, lineage, self.line.made))
        await self.canary.serve(candidate, lambda: lineage == self.line.lineage and not self._line_outrun())
        await self.lane.go()

    async def _job(self, batch_id: str) -> Job:
        head = self.chain.head()
        head_files = await self.reader.head_files()
        start = self.line.files if self.line.files is not None else checkpoint_part(head_files)
        serving = self.chain.serving()
        return Job(self.scenario, batch_id, start, head, head_files, serving, self.trainer, dict(self.algorithm_state))

    def starved(self) -> bool:
        return self.wait.starved()

    def for_gate(self, candidate: LearnedCandidate) -> LearnedCandidate:
        """Whether the learner waits for samples, and the split's live scores, as the gate starts."""
        return dataclasses.replace(candidate, starved=self.wait.starved(), live=self.canary.live.evidence())

    async def settle(self, outcome: Outcome) -> None:
        """What the gate's outcome means for the line being trained (the lane's `Line.settle`)."""
        candidate, exc = outcome.candidate, outcome.error
        if isinstance(exc, StaleHead):  # a rollback or promote moved the head while the gate ran
            if self.line.follow(self.chain.head().release_id):  # not dropped already (head_moved)
                self._drop_working("the head moved during evaluation")
            await self.abandon(
                candidate.batch_id, f"head_moved: the head moved during evaluation: {exc}", metrics=candidate.metrics
            )
            return
        if exc is not None:
            self._drop_working(f"its evaluation failed ({type(exc).__name__})")
            await self.abandon(
                candidate.batch_id, f"evaluation failed: {type(exc).__name__}: {exc}", metrics=candidate.metrics
            )
            raise exc
        verdict = outcome.verdict
        assert verdict is not None
        self.stats.count(verdict)
        head = self.chain.head().release_id
        if verdict.decision in ("select", "review"):
            self.line.published_at(outcome.position)
            if verdict.decision == "select":
                self.canary.published(head, candidate.batch_id)
        elif head != self.line.head:  # not yet noticed (`head_moved` sets line.head)
            self._drop_working("the head moved (a rollback or promote) while the gate judged")
        elif (reason := self.line.why_drop(verdict)) is not None:
            self._drop_working(reason)
        else:
            self.canary.undecided(verdict, head)
        self.line.head = head

    async def left_gate(self, queued: Queued) -> None:
        await self.canary.left_gate(queued[0].batch_id, line_dropped=queued[1] != self.line.lineage)

    def failed(self, exc: Exception) -> None:
        self.stats.last_error = f"{type(exc).__name__}: {exc}"

    async def head_moved(self) -> None:
        """The head moved away from the line being trained (a rollback or promote): the canary
        stops now, and the line is dropped, so no candidate trained from before is canaried or
        judged; the next trains from the new head."""
        if self.line.follow(self.chain.head().release_id):
            self._drop_working("the head moved (a rollback or promote)")
        await self.canary.stop()

    def _line_outrun(self) -> bool:
        return self.line.outrun_by(self.chain.head(), judging=self.lane.at_gate is not None)

    def _drop_working(self, reason: str) -> None:
        self.line.drop(reason)
        self.canary.line_dropped()

    async def abandon(self, batch_id: str, reason: str, routine: bool = False, metrics: dict | None = None) -> None:
        """Close the batch in the log as abandoned, with its candidate's `metrics` when one was
        made. `routine`: superseded by a newer candidate that carries its steps, every few seconds
        in normal work, so not a warning."""
        level = logging.INFO if routine else logging.WARNING
        log.log(level, "learner %s: batch %s abandoned: %s", self.scenario, batch_id, reason)
        with contextlib.suppress(NotFound):
            await asyncio.to_thread(self.chain.abandon_batch, batch_id, reason, metrics)
        self.stats.abandoned += 1

    def _staleness_of(self, release_id: str) -> int | None:
        """Releases published after `release_id` (None: not in this chain); a canary of this learner's is the newest."""
        return 0 if release_id in self.live.scores else self.reader.releases_since(release_id)

    status = learner_status  # what `GET /reef/status` shows of this learner
