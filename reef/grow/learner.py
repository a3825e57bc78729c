"""The learner of one scenario, the same loop for every recipe: reported records in, candidates out.

One of three loops (docs/architecture.md): intake and training here, judging in the gate's lane
(`reef.commit.gate_lane`), the canary in `reef.grow.canary.CanaryLoop`. In a fixed, visible order:
read new reports since the cursor, show them to the canary and let the recipe take them in (or
count why not); once the recipe has a batch, log it (invariant 9, before any work), let the
recipe make a candidate of it (train through the primitives, or propose a harness change), and
hand the candidate on. A weights candidate goes to the canary and to the lane's one-place queue,
and training goes on from it while the gate judges; a harness candidate is made from the head
and judged against exactly that head, here, one at a time. A recipe that gives no candidate
closes its batch as abandoned, with its reason. At most three batches are open: at the gate,
waiting, in training.

Each outcome comes back here (`settle`): a published candidate starts the line's count again; a
candidate trained on from one the gate then found surely worse is abandoned unjudged; a rollback
or promote sends training back to the head: the canary stops at once (`head_moved`, called by the
route on this front end; on another front end's, the learner sees the head moved at its next
step), and no candidate of a line begun before the head moved is canaried or judged. With
`gate.live_split` and a canary, once STALLED_VERDICTS verdicts in a row against one head run to
their last look undecided with the candidate not behind on the tasks, the canary serves the
split's fraction until the head moves, and each later candidate goes to the gate with the split's
live scores (in memory only). Making a candidate is a span `reef.learn` (`reef.observe.spans`). On
start, the batches the log shows open are resumed in order if their records are all still there,
and abandoned (logged) otherwise. Serving never waits on any of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any, Awaitable, Callable, Protocol

from reef.commit.gate_lane import Decide, GateLane, Outcome, Overtake, Queued, Warm
from reef.core.canonical import new_id
from reef.core.errors import NotFound, StaleHead
from reef.core.learned import LearnedCandidate
from reef.core.training import checkpoint_part
from reef.core.types import CommitEntry, Operation, Release, ReleaseRef, ReportedRecords
from reef.grow.canary import STALLED_VERDICTS, CanaryLoop, CanaryServing
from reef.grow.learner_stats import LearnerStats, LineageEvidence, SampleWait, behind_on_tasks, promising
from reef.grow.loop import keep_stepping
from reef.grow.recipe import Abandon, Batch, Job, LearnerView, Made, Recipe
from reef.grow.training_client import TrainingClient
from reef.observe import spans
from reef.observe.store import ExperienceStore

log = logging.getLogger("reef.learner")
WORKING_STATE = {"weights": "training", "harness": "proposing"}
HeadFiles = Callable[[], Awaitable[dict[str, bytes]]]


class Chain(Protocol):  # the parts of commit's ReleaseChain a learner uses
    scenario: str

    def last_step(self) -> int: ...
    def head(self) -> Release: ...
    def serving(self) -> ReleaseRef: ...
    def high_water(self) -> int: ...
    def algorithm_state(self) -> dict | None: ...
    def releases(self) -> list[Release]: ...
    def open_batches(self) -> list[dict]: ...
    def history(self) -> list[CommitEntry]: ...
    def begin_batch(self, batch_id: str, record_ids: list[str], report_ids: list[str], *, high_water: int,
                    expected_step: int, max_open: int = 1) -> Any: ...
    def abandon_batch(self, batch_id: str, reason: str) -> Any: ...


# The gate answers ahead of the first candidate once the learner has waited this long for samples:
# traffic that thin (an agent's turns) leaves the gate idle, and the first verdict then asks only its
# candidate (about half its seconds, bench/first_verdict.py); faster traffic brings the first batch
# sooner, and answering at once would slow its first batches instead.
ANSWER_AHEAD_AFTER_S = 15.0


class Learner:
    def __init__(self, chain: Chain, store: ExperienceStore, recipe: Recipe, decide: Decide, head_files: HeadFiles,
                 trainer: TrainingClient | None = None, poll_interval: float = 0.5,
                 canary: CanaryServing | None = None, gate_after: int = 1, warm: Warm | None = None,
                 overtake: Overtake | None = None, overtake_after: int = 1,
                 live_split: float | None = None, answer_ahead_after: float = ANSWER_AHEAD_AFTER_S) -> None:
        self.chain, self.scenario, self.store, self.recipe = chain, chain.scenario, store, recipe
        self.head_files, self.trainer, self.poll_interval = head_files, trainer, poll_interval
        self.answer_ahead_after = answer_ahead_after
        self.pipelined = recipe.surface == "weights"
        self.stats = LearnerStats()
        self.lane = GateLane(self.scenario, decide, self._span_attributes, gate_after=gate_after, warm=warm,
                             overtake=overtake, overtake_after=overtake_after)
        self.lane.line = self
        self.canary = CanaryLoop(self.scenario, canary if self.pipelined else None, live_split, self.stats)
        self.undecided = ("", 0)  # (head, verdicts in a row left undecided against it), for the split
        self.evidence = LineageEvidence()  # the gate's wins and losses since the working line began
        self.wait = SampleWait(idle_since=time.monotonic())  # waiting for samples from the start
        self.cursor = chain.high_water()
        self.consumed = batched_record_ids(chain)
        self.algorithm_state = dict(chain.algorithm_state() or {})  # ahead of the log while a candidate is judged
        self.view = LearnerView(self.scenario, self.consumed, self._staleness_of, chain.head, self._head_files,
                                self.stats.dropped, store)
        self.working: dict[str, bytes] | None = None  # the last candidate, once training goes on from it
        self.working_head = chain.head().release_id  # the head `working` continues from; a rollback resets it
        self.lineage = 0  # bumped whenever `working` is dropped: candidates trained from it are void
        self.drop_reason = ""
        self.line_made = 0  # batches in the working line, counted from the head it began at
        self.line_published = 0  # the position in that line of the release this learner published last
        self._head: tuple[str, dict[str, bytes]] | None = None
        self._positions: tuple[int, dict[str, int]] | None = None  # (log step, release id -> releases since)

    # the lane's and the canary's state, as the learner's tests and status read it
    waiting = property(lambda self: self.lane.waiting)
    at_gate = property(lambda self: self.lane.at_gate)
    judging = property(lambda self: self.lane.judging)
    live = property(lambda self: self.canary.live)

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
        batch = await self.recipe.next_batch(self.view)
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
            await asyncio.to_thread(self.chain.begin_batch, batch_id, batch.record_ids, batch.report_ids,
                                    high_water=high_water, expected_step=self.chain.last_step(),
                                    max_open=3 if self.pipelined else 1)
        self.consumed.update(batch.record_ids)
        self.stats.batches += 1
        if self._line_outrun():  # a rollback or promote: this batch trains from the new head
            await self.head_moved()
        lineage = self.lineage
        job = await self._job(batch_id)
        self.stats.state = WORKING_STATE[self.recipe.surface]
        try:
            with spans.span("reef.learn", self._span_attributes(batch_id, {
                    "reef.surface": self.recipe.surface, "reef.batch.records": len(batch.record_ids)}), ok=(Abandon,)):
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
        if lineage != self.lineage:  # the candidate it trained on from was dropped meanwhile
            await self.abandon(batch_id, f"trained on from a candidate that was dropped: {self.drop_reason}")
            return
        self.working = made.files
        self.line_made += 1
        self.stats.candidates += 1
        candidate = self._candidate(batch_id, high_water, job, made)
        if not self.pipelined:
            await self.settle(await self.lane.judge(candidate))
            self.stats.state = "collecting"
            return
        await self.lane.offer((candidate, lineage, self.line_made))
        await self.canary.serve(candidate, lambda: lineage == self.lineage and not self._line_outrun())
        await self.lane.go()

    async def _job(self, batch_id: str) -> Job:
        head = self.chain.head()
        head_files = await self._head_files()
        start = self.working if self.working is not None else checkpoint_part(head_files)
        return Job(self.scenario, batch_id, start, head, head_files, self.chain.serving(), self.trainer,
                   dict(self.algorithm_state))

    def _candidate(self, batch_id: str, high_water: int, job: Job, made: Made) -> LearnedCandidate:
        state = {**job.algorithm_state, "recipe": self.recipe.name}
        return LearnedCandidate(self.scenario, batch_id, self.recipe.name, made.files, job.head.release_id,
                                job.head_files, high_water, made.metadata, made.metrics, state, made.held_out)

    def starved(self) -> bool:
        return self.wait.starved()

    def for_gate(self, candidate: LearnedCandidate) -> LearnedCandidate:
        """Whether the learner waits for samples, and the split's live scores, as the gate starts."""
        return dataclasses.replace(candidate, starved=self.wait.starved(), live=self.canary.live.evidence())

    async def settle(self, outcome: Outcome) -> None:
        """What the gate's outcome means for the line being trained (the lane's `Line.settle`)."""
        candidate, exc = outcome.candidate, outcome.error
        if isinstance(exc, StaleHead):  # a rollback or promote moved the head while the gate ran
            if self.chain.head().release_id != self.working_head:  # not dropped already (head_moved)
                self._drop_working("the head moved during evaluation")
                self.working_head = self.chain.head().release_id
            await self.abandon(candidate.batch_id, f"head_moved: the head moved during evaluation: {exc}")
            return
        if exc is not None:
            self._drop_working(f"its evaluation failed ({type(exc).__name__})")
            await self.abandon(candidate.batch_id, f"evaluation failed: {type(exc).__name__}: {exc}")
            raise exc
        verdict = outcome.verdict
        assert verdict is not None
        self.stats.count(verdict)
        head = self.chain.head().release_id
        if verdict.decision in ("select", "review"):
            self.line_published = outcome.position
            self.evidence = LineageEvidence()
            if verdict.decision == "select":
                self.canary.published(head, candidate.batch_id)
        elif head != self.working_head:  # not yet noticed (`head_moved` sets working_head)
            self._drop_working("the head moved (a rollback or promote) while the gate judged")
        elif not promising(verdict):  # the next candidate starts from the head
            self._drop_working("the gate found it worse than the serving release")
        elif self.evidence.add(verdict).surely_worse():
            self._drop_working(f"its line lost {self.evidence.losses} to {self.evidence.wins} over "
                               f"{self.evidence.verdicts} rejected candidates")
        elif (self.canary.live_split and not self.live.split and verdict.metrics.get("early") is False
              and not behind_on_tasks(verdict) and self._stalled(head)):
            self.live.begin_split()  # the tasks alone cannot tell: serve the line beside the head
            log.info("learner %s: the line and the serving release now share the traffic (%s to the line)",
                     self.scenario, self.canary.live_split)
        self.working_head = head

    async def left_gate(self, queued: Queued) -> None:
        await self.canary.left_gate(queued[0].batch_id, line_dropped=queued[1] != self.lineage)

    def failed(self, exc: Exception) -> None:
        self.stats.last_error = f"{type(exc).__name__}: {exc}"

    def _stalled(self, head: str) -> bool:
        """Count one more verdict left undecided against `head`, its candidate not behind on the
        tasks: whether STALLED_VERDICTS are (verdicts of other kinds in between are not counted)."""
        count = self.undecided[1] + 1 if self.undecided[0] == head else 1
        self.undecided = (head, count)
        return count >= STALLED_VERDICTS

    async def head_moved(self) -> None:
        """The head moved away from the line being trained (a rollback or promote): the canary
        stops now, and the line is dropped, so no candidate trained from before is canaried or
        judged; the next trains from the new head."""
        head = self.chain.head().release_id
        if head != self.working_head:
            self._drop_working("the head moved (a rollback or promote)")
            self.working_head = head
        await self.canary.stop()

    def _line_outrun(self) -> bool:
        """Whether the head is no longer the one the working line continues from, other than by
        this learner's own publication, which its gate makes before the verdict reaches the learner."""
        head = self.chain.head()
        if head.release_id == self.working_head:
            return False
        own = (self.lane.at_gate is not None and head.operation is Operation.TRAINING
               and head.parent_release_id == self.working_head)
        return not own

    def _span_attributes(self, batch_id: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"reef.scenario": self.scenario, "reef.batch_id": batch_id, "reef.recipe": self.recipe.name,
                **(extra or {})}

    def _drop_working(self, reason: str) -> None:
        self.working, self.lineage, self.drop_reason = None, self.lineage + 1, reason
        self.line_made = self.line_published = 0
        self.evidence = LineageEvidence()
        if self.live.split:  # the new line's live scores are its own
            self.live.begin_split()

    async def abandon(self, batch_id: str, reason: str, routine: bool = False) -> None:
        """Close the batch in the log as abandoned. `routine`: superseded by a newer candidate that
        carries its steps, every few seconds in normal work, so not a warning."""
        log.log(logging.INFO if routine else logging.WARNING, "learner %s: batch %s abandoned: %s",
                self.scenario, batch_id, reason)
        with contextlib.suppress(NotFound):
            await asyncio.to_thread(self.chain.abandon_batch, batch_id, reason)
        self.stats.abandoned += 1

    def _staleness_of(self, release_id: str) -> int | None:
        """How many releases were published after `release_id` (None: not in this chain); a
        canary of this learner's counts as the newest."""
        if release_id in self.live.scores:
            return 0
        step = self.chain.last_step()
        if self._positions is None or self._positions[0] != step:
            self._positions = (step, {r.release_id: i for i, r in enumerate(self.chain.releases())})  # 0 = the head
        return self._positions[1].get(release_id)

    async def _head_files(self) -> dict[str, bytes]:
        """The head's content, read once per head."""
        head = self.chain.head().release_id
        if self._head is None or self._head[0] != head:
            self._head = (head, await self.head_files())
        return self._head[1]

    def status(self) -> dict[str, Any]:
        s = self.stats
        out = {"scenario": self.scenario, "recipe": self.recipe.name, "surface": self.recipe.surface,
               "state": s.state, "cursor": self.cursor, **self.recipe.status(), "batches": s.batches,
               "candidates": s.candidates, "published": s.published, "pending_review": s.review,
               "rejected": s.rejected, "abandoned": s.abandoned, "dropped": dict(s.dropped),
               "last_verdict": s.last_verdict, "last_error": s.last_error,
               "waiting_for_samples": None if self.wait.fraction is None else round(self.wait.fraction, 3)}
        if self.pipelined:
            out["batches_past_release"] = self.line_made - self.line_published
        if self.canary.serving is not None:
            out["canary"] = self.canary.summary()
        if self.trainer is not None:
            out["training_queue"] = self.trainer.worker.pending().get(self.scenario, 0)
        return out


def reported_record(store: ExperienceStore, record_id: str) -> ReportedRecords:
    """A record with its latest report, as a logged batch is read back after a restart."""
    record = store.get_record(record_id)
    reports = store.reports_for(record_id)
    if not reports:
        raise NotFound(f"record {record_id} has no report")
    return ReportedRecords(reports[-1], (record,))


def batched_record_ids(chain: Chain) -> set[str]:
    """Every record a logged batch named, however the batch ended: none is used twice."""
    return {rid for entry in chain.history() if entry.operation is Operation.BATCH and entry.batch
            for rid in entry.batch["record_ids"]}
