"""The learner of one scenario, the same loop for every recipe: reported records in, candidates out.

One loop, in a fixed, visible order: read new reports since the cursor and let the recipe take
them in (or count why not); once the recipe has a batch, log it (invariant 9, before any work),
let the recipe make a candidate of it (train through the primitives, or propose a harness
change), and hand the candidate to the publisher (the gate, then publish, hold for review or
reject, which closes the batch in the log). A recipe that gives no candidate closes its batch
as abandoned, with its reason.

Weights candidates are pipelined: the gate judges one in the background while training goes
on from it, so the training process never waits for an evaluation; while none is ready, the
gate answers its tasks for the serving release ahead (from the first candidate on, or earlier
once the wait for the first batch shows the traffic is thin). A candidate finished while
the gate is busy waits for it; a newer one, trained on from it, takes its place (the one it
replaces is logged as abandoned, `superseded`: its steps live on in the newer one), so the gate
always judges the newest, and hears whether the learner has been waiting for samples (then
`gate.concurrency_when: starved` leaves the serving runtime to live traffic). With
`gate.after_batches` above 1, a line goes to the gate only once it is that many candidates past
the release it would replace; a nearer one waits for the next, the same way. With
`gate.overtake_after`, a candidate that many batches further along the line than the one being
judged tells the gate, which stops that verdict at its next undecided look. At most three
batches are open: at the gate, waiting, in training. A
candidate trained on from one the gate then found surely worse is abandoned (logged) unjudged,
and a rollback or promote sends training back to the head: the canary stops at once (`head_moved`,
called by the route on this front end; on another front end's, the learner sees the head moved at
its next step), and no candidate of a line begun before the head moved is canaried or judged. With `gate.live_split` and a canary, once
STALLED_VERDICTS verdicts in a row against one head run to their last look undecided with the
candidate not behind on the tasks (a tie or more wins than losses), the canary
serves the split's fraction until the head moves, and each later candidate goes to the gate with
the split's live scores (`reef.grow.canary.LiveScores.evidence`); the split is in memory only, and
starts again after a restart. A harness candidate is made from the head and judged against exactly that head, one at a
time. With traces on (`reef.observe.spans`), making a candidate is a span `reef.learn` (the
training client's `reef.train.*` step spans are its children) and judging it one `reef.gate`,
both with `reef.scenario`, `reef.batch_id` and `reef.recipe`; the gate's carries the decision
and the verdict's numeric metrics (`reef.gate.*`). On start, the batches the log shows open are
resumed in order if their records are all still there, and abandoned (logged) otherwise.
Serving never waits on any of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any, Awaitable, Callable, Protocol

from reef.core.canonical import new_id
from reef.core.errors import NotFound, StaleHead
from reef.core.learned import LearnedCandidate
from reef.core.training import checkpoint_part
from reef.core.types import CommitEntry, Operation, Release, ReleaseRef, ReportedRecords, Verdict
from reef.grow.canary import STALLED_VERDICTS, CanaryServing, LiveScores, canary_release_id
from reef.grow.learner_stats import LearnerStats, LineageEvidence, SampleWait, behind_on_tasks, promising
from reef.grow.loop import keep_stepping
from reef.grow.recipe import Abandon, Batch, Job, LearnerView, Made, Recipe
from reef.grow.training_client import TrainingClient
from reef.observe import spans
from reef.observe.store import ExperienceStore

log = logging.getLogger("reef.learner")
WORKING_STATE = {"weights": "training", "harness": "proposing"}


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


Decide = Callable[[LearnedCandidate], Awaitable[Verdict]]
HeadFiles = Callable[[], Awaitable[dict[str, bytes]]]
Overtake = Callable[[LearnedCandidate], None]  # the gate may stop judging this one undecided
Warm = Callable[[bool], Awaitable[int]]  # (whether the learner waits for samples) -> tasks answered, 0: none left
# The gate answers its tasks for the serving release ahead of the first candidate once the learner
# has waited this long for its samples: traffic that thin (an agent's turns: a batch in a minute or
# more) leaves the gate's side idle, and the first verdict then asks only its candidate (0.52x its
# seconds at one agent's pace, bench/first_verdict.py). Faster traffic brings the first batch sooner
# (the race's 8 clients: within about 10 s on one CPU core), and answering at once would slow its
# first batches instead: in two demo races the first release came 10-20 s later (docs/learning_race.md).
ANSWER_AHEAD_AFTER_S = 15.0


class Learner:
    def __init__(self, chain: Chain, store: ExperienceStore, recipe: Recipe, decide: Decide, head_files: HeadFiles,
                 trainer: TrainingClient | None = None, poll_interval: float = 0.5,
                 canary: CanaryServing | None = None, gate_after: int = 1, warm: Warm | None = None,
                 overtake: Overtake | None = None, overtake_after: int = 1,
                 live_split: float | None = None, answer_ahead_after: float = ANSWER_AHEAD_AFTER_S) -> None:
        self.chain = chain
        self.scenario = chain.scenario
        self.store = store
        self.recipe = recipe
        self.decide = decide
        self.head_files = head_files
        self.trainer = trainer
        self.poll_interval = poll_interval
        self.gate_after = gate_after  # batches a weights line takes past the serving release before it is judged
        self.warm = warm  # the gate answers its tasks for the serving release while no candidate is ready
        self.answer_ahead_after = answer_ahead_after
        self.answered_ahead = False  # whether the gate began answering ahead before the first candidate
        self.overtake = overtake  # None: a verdict always runs to its decision
        self.overtake_after = overtake_after  # batches a waiting candidate is past the judged one to overtake it
        self.pipelined = recipe.surface == "weights"
        self.canary = canary if self.pipelined else None
        self.canary_fraction = canary.fraction if canary is not None else 0.0  # learner.canary's
        self.live_split = live_split if self.canary is not None else None  # gate.live_split
        self.undecided = ("", 0)  # (head, verdicts in a row left undecided against it), for the split
        self.live = LiveScores()  # the canary's live scores and the serving release's
        self.canary_batch: str | None = None  # the candidate the canary serves
        self.evidence = LineageEvidence()  # the gate's wins and losses since the working line began
        self.stats = LearnerStats()
        self.wait = SampleWait(idle_since=time.monotonic())  # waiting for samples from the start
        self.cursor = chain.high_water()
        self.consumed = batched_record_ids(chain)
        self.algorithm_state = dict(chain.algorithm_state() or {})  # ahead of the log while a candidate is judged
        self.view = LearnerView(self.scenario, self.consumed, self._staleness_of, chain.head, self._head_files,
                                self.stats.dropped, store)
        self.working: dict[str, bytes] | None = None  # the last candidate, once training goes on from it
        self.working_head = chain.head().release_id  # the head `working` continues from; a rollback resets it
        self.published_here: str | None = None  # the last release this learner's gate published
        self.lineage = 0  # bumped whenever `working` is dropped: candidates trained from it are void
        self.drop_reason = ""
        self.judging: asyncio.Task[None] | None = None  # the gate's turn, while training goes on
        self.waiting: tuple[LearnedCandidate, int, int] | None = None  # the next for the gate: lineage, position
        self.at_gate: tuple[LearnedCandidate, int, int] | None = None  # the one being judged: lineage, position
        self.line_made = 0  # batches in the working line, counted from the head it began at
        self.line_published = 0  # the position in that line of the release this learner published last
        self.unheld: str | None = None  # a held candidate's batch, sent to the gate as the traffic lags
        self._head: tuple[str, dict[str, bytes]] | None = None
        self._positions: tuple[int, dict[str, int]] | None = None  # (log step, release id -> releases since)

    async def run(self) -> None:
        try:
            await self.recover()
            await keep_stepping(f"learner {self.scenario}", self.step, self.stats, self.poll_interval)
        finally:
            if self.judging is not None:
                self.judging.cancel()

    async def recover(self) -> None:
        """Resume the batches the log shows open, oldest first, or abandon them (logged)."""
        for logged in self.chain.open_batches():
            batch_id = logged["batch_id"]
            try:
                batch = self.recipe.resume([reported_record(self.store, rid) for rid in logged["record_ids"]])
            except NotFound as exc:
                await self._abandon(batch_id, f"cannot resume after restart: {exc}")
                continue
            log.info("learner %s: resuming batch %s after a restart", self.scenario, batch_id)
            try:
                await self._make(batch, batch_id, int(logged.get("high_water", self.cursor)), logged=True)
            except Exception as exc:  # noqa: BLE001 - abandoned by _make; the next batch and learning go on
                log.exception("learner %s: resuming batch %s failed", self.scenario, batch_id)
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
        await self._judged()

    async def step(self) -> bool:
        """Take in new reports; make a candidate when the recipe has a batch. True if it did work."""
        if self.judging is not None and self.judging.done():
            await self._judged()
        if self._line_outrun():  # a rollback or promote on another front end (this one's calls head_moved)
            await self.head_moved()
        items = self.store.reported_since(self.scenario, self.cursor, limit=512)
        if items:
            await self._watch_canary(items)
            self.recipe.intake(items, self.view)
            self.cursor = items[-1].cursor
        batch = await self.recipe.next_batch(self.view)
        if batch is None:
            await self._unhold_when_traffic_lags()
            await self._answer_ahead_while_traffic_is_thin()
            self.stats.state = "collecting" if self.at_gate is None else "evaluating"  # answering ahead is not judging
            return bool(items)
        started = time.monotonic()
        await self._make(batch, new_id(), self.recipe.high_water(self.cursor), logged=False)
        self.wait.made(started, time.monotonic())
        return True

    async def _make(self, batch: Batch, batch_id: str, high_water: int, logged: bool) -> None:
        """Make a candidate of `batch` and send it to the gate. A weights candidate is queued for
        the gate, which judges in the background while the next one trains on from it; a harness
        candidate is judged here, before the next batch."""
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
            await self._abandon(batch_id, f"{exc.kind}: {exc.reason}")
            return
        except Exception as exc:
            await self._abandon(batch_id, f"{self.stats.state} failed: {type(exc).__name__}: {exc}")
            raise
        finally:
            self.algorithm_state = job.algorithm_state
        if self.pipelined and self._line_outrun():  # the head moved while it trained: its line is void
            await self.head_moved()
        if lineage != self.lineage:  # the candidate it trained on from was dropped meanwhile
            await self._abandon(batch_id, f"trained on from a candidate that was dropped: {self.drop_reason}")
            return
        self.working = made.files
        self.line_made += 1
        self.stats.candidates += 1
        candidate = self._candidate(batch_id, high_water, job, made)
        if self.pipelined:
            await self._to_gate(candidate, lineage, self.line_made)
        else:
            await self._judge(candidate)
            self.stats.state = "collecting"

    async def _to_gate(self, candidate: LearnedCandidate, lineage: int, position: int) -> None:
        """Queue a weights candidate for the gate, in place of an older one still waiting."""
        replaced, self.waiting = self.waiting, (candidate, lineage, position)
        if replaced is not None:
            await self._abandon(replaced[0].batch_id, f"superseded: batch {candidate.batch_id}, trained on from it, "
                                "goes to the gate instead", routine=True)
        await self._start_canary(candidate, lineage)
        if self._gate_idle():
            await self._start_gate_turns()
        else:
            self._overtake_at_gate()

    def _overtake_at_gate(self) -> None:
        """Tell the gate when the candidate waiting is `overtake_after` batches further along the
        line than the one it judges: a verdict still undecided after a look then stops, so the
        gate judges the newer one (on a slow runtime a verdict can outlast many candidates)."""
        if self.overtake is None or self.at_gate is None or self.waiting is None:
            return
        judged, lineage, position = self.at_gate
        _, waiting_lineage, waiting_position = self.waiting
        if waiting_lineage == lineage == self.lineage and waiting_position - position >= self.overtake_after:
            self.overtake(judged)

    async def _unhold_when_traffic_lags(self) -> None:
        """A candidate is held back (`gate_after`) only while the next is on its way: once the
        learner has waited for samples longer than making a candidate takes (the traffic slowed or
        stopped), the one waiting goes to the gate, and its canary does not serve unjudged for good."""
        if self.waiting is None or not self._gate_idle() or self._ready_for_gate():
            return
        if self.wait.longer_than_making(time.monotonic()):
            self.unheld = self.waiting[0].batch_id
            await self._start_gate_turns()

    async def _answer_ahead_while_traffic_is_thin(self) -> None:
        """Before the first candidate, once the learner has waited `answer_ahead_after` seconds for
        samples, the gate answers its tasks for the serving release (otherwise it begins at the
        first candidate)."""
        if self.warm is None or self.answered_ahead or not self._gate_idle() or self.waiting is not None:
            return
        waited = self.wait.first_wait(time.monotonic())
        if waited is not None and waited >= self.answer_ahead_after:
            self.answered_ahead = True
            await self._start_gate_turns()

    async def _start_gate_turns(self) -> None:
        await self._judged()
        self.judging = asyncio.get_running_loop().create_task(self._gate_turns(), name=f"gate:{self.scenario}")

    def _ready_for_gate(self) -> bool:
        """Whether the waiting candidate goes to the gate now: one of a dropped line goes (to be
        abandoned); one fewer than `gate_after` batches past the release its line would replace
        waits for the next, which takes its place. A candidate a step or two from that release
        differs from it on a few greedy answers either way and cannot win, and judging it holds
        the gate for minutes (bench/learning_race.py)."""
        if self.waiting is None:
            return False
        candidate, lineage, position = self.waiting
        return (lineage != self.lineage or position - self.line_published >= self.gate_after
                or candidate.batch_id == self.unheld)

    async def _gate_turns(self) -> None:
        """Judge the waiting candidate, then the one waiting after it, while one is ready. While
        none is, the gate answers its tasks for the serving release (the next verdict's other half)."""
        while True:
            while not self._ready_for_gate():
                if not await self._warm():  # a chunk at a time; none left to answer: wait for a candidate
                    return
            assert self.waiting is not None
            (candidate, lineage, position), self.waiting, self.unheld = self.waiting, None, None
            if lineage != self.lineage:
                await self._abandon(candidate.batch_id,
                                    f"trained on from a candidate that was dropped: {self.drop_reason}")
                continue
            self.at_gate = (candidate, lineage, position)
            try:  # whether the learner waits for samples, and the split's live scores, as the gate starts
                await self._judge(dataclasses.replace(candidate, starved=self.wait.starved(),
                                                      live=self.live.evidence()), position)
            except Exception as exc:  # noqa: BLE001 - its batch is abandoned; the next candidate still goes
                log.exception("learner %s: evaluation failed", self.scenario)
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
            finally:
                self.at_gate = None
                if self.canary_batch == candidate.batch_id or lineage != self.lineage:
                    await self._stop_canary()  # judged (served now as the head, or rejected), or its line dropped

    async def _warm(self) -> int:
        """The gate answers some of its tasks for the serving release; how many (0: none left, or failed)."""
        if self.warm is None:
            return 0
        try:
            return int(await self.warm(self.wait.starved()) or 0)
        except Exception as exc:  # noqa: BLE001 - the verdict will answer them itself
            log.warning("learner %s: the gate could not answer its tasks ahead: %s: %s", self.scenario,
                        type(exc).__name__, exc)
            return 0

    async def _start_canary(self, candidate: LearnedCandidate, lineage: int) -> None:
        """The newest candidate of the line the gate judges serves the canary (in place of an
        older one): the next candidate trains on from it, so its samples are nearly on-policy.
        Never one of a line the head has left (a rollback or promote since the line began)."""
        if self.canary is None:
            return
        if lineage != self.lineage or self._line_outrun():
            await self._stop_canary()  # the one before is of that line too
            return
        self.canary.fraction = self.live_split if self.live.split and self.live_split else self.canary_fraction
        try:
            release_id = await self.canary.start(candidate.batch_id, candidate.files)
        except Exception as exc:  # noqa: BLE001 - no canary for this one; the gate judges it all the same
            log.exception("learner %s: the canary of batch %s did not start", self.scenario, candidate.batch_id)
            self.stats.last_error = f"canary: {type(exc).__name__}: {exc}"
            self.live.running, self.canary_batch = False, None  # the one before was stopped first
            return
        self.canary_batch = candidate.batch_id
        self.live.start(release_id)
        # `start` returned as the canary began to admit requests, nothing awaited since: a rollback
        # that moved the head while it loaded is seen here before any request meets the canary (one
        # that moves it later stops it itself, `head_moved`)
        if lineage != self.lineage or self._line_outrun():
            log.warning("learner %s: the canary of batch %s stopped as it started: the head moved under its line",
                        self.scenario, candidate.batch_id)
            await self._stop_canary()

    async def _stop_canary(self) -> None:
        if self.canary is not None and self.live.running:
            self.live.running, self.canary_batch = False, None
            await self.canary.stop()

    async def head_moved(self) -> None:
        """The head moved away from the line being trained (a rollback or promote): the canary
        stops now, and the line is dropped, so no candidate trained from before is canaried or
        judged; the next trains from the new head."""
        head = self.chain.head().release_id
        if head != self.working_head:
            self._drop_working("the head moved (a rollback or promote)")
            self.working_head = head
        await self._stop_canary()

    def _line_outrun(self) -> bool:
        """Whether the head is no longer the one the working line continues from, other than by
        this learner's own publication, which its gate makes before the verdict reaches the learner."""
        head = self.chain.head()
        if head.release_id == self.working_head:
            return False
        own = (self.at_gate is not None and head.operation is Operation.TRAINING
               and head.parent_release_id == self.working_head)
        return not own

    async def _watch_canary(self, items: list[ReportedRecords]) -> None:
        """Withdraw the canary at once when its live scores are worse than the serving release's."""
        if self.canary is None:
            return
        self.live.add(items, self.chain.serving().release_id)
        if self.live.worse():
            self.live.withdrawn += 1
            log.warning("learner %s: canary withdrawn, its live scores are worse: %s", self.scenario,
                        self.live.summary())
            await self._stop_canary()

    def _gate_idle(self) -> bool:
        return self.judging is None or self.judging.done()

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

    async def _judge(self, candidate: LearnedCandidate, position: int = 0) -> None:
        """The gate, then publish or reject (which closes the batch in the log). `position`: the
        candidate's batches in its line, for a weights candidate."""
        try:
            with spans.span("reef.gate", self._span_attributes(candidate.batch_id), ok=(StaleHead,)) as span:
                verdict = await self.decide(candidate)
                span.set_attributes({"reef.gate.decision": verdict.decision,
                                     **spans.numeric("reef.gate.", verdict.metrics)})
        except StaleHead as exc:  # a rollback or promote moved the head while the gate ran
            if self.chain.head().release_id != self.working_head:  # not dropped already (head_moved)
                self._drop_working("the head moved during evaluation")
                self.working_head = self.chain.head().release_id
            await self._abandon(candidate.batch_id, f"head_moved: the head moved during evaluation: {exc}")
            return
        except Exception as exc:
            self._drop_working(f"its evaluation failed ({type(exc).__name__})")
            await self._abandon(candidate.batch_id, f"evaluation failed: {type(exc).__name__}: {exc}")
            raise
        self.stats.count(verdict)
        head = self.chain.head().release_id
        if verdict.decision in ("select", "review"):
            self.published_here, self.line_published = head, position
            self.evidence = LineageEvidence()
            if verdict.decision == "select" and self.canary is not None:
                self.live.published(head, canary_release_id(candidate.batch_id))
        elif head != self.working_head:  # not yet noticed (`head_moved` sets working_head)
            self._drop_working("the head moved (a rollback or promote) while the gate judged")
        elif not promising(verdict):  # the next candidate starts from the head
            self._drop_working("the gate found it worse than the serving release")
        elif self.evidence.add(verdict).surely_worse():
            self._drop_working(f"its line lost {self.evidence.losses} to {self.evidence.wins} over "
                               f"{self.evidence.verdicts} rejected candidates")
        elif (self.live_split and not self.live.split and verdict.metrics.get("early") is False
              and not behind_on_tasks(verdict) and self._stalled(head)):
            self.live.begin_split()  # the tasks alone cannot tell: serve the line beside the head
            log.info("learner %s: the line and the serving release now share the traffic (%s to the line)",
                     self.scenario, self.live_split)
        self.working_head = head

    def _stalled(self, head: str) -> bool:
        """Count one more verdict left undecided against `head`, its candidate not behind on the
        tasks: whether STALLED_VERDICTS are (verdicts of other kinds in between are not counted)."""
        count = self.undecided[1] + 1 if self.undecided[0] == head else 1
        self.undecided = (head, count)
        return count >= STALLED_VERDICTS

    async def _judged(self) -> None:
        """Wait for the candidate at the gate, if any; a failure there is shown, not raised."""
        task, self.judging = self.judging, None
        if task is None:
            return
        try:
            await task
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged and shown; its batch is abandoned
            log.exception("learner %s: evaluation failed", self.scenario)
            self.stats.last_error = f"{type(exc).__name__}: {exc}"

    def _span_attributes(self, batch_id: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"reef.scenario": self.scenario, "reef.batch_id": batch_id, "reef.recipe": self.recipe.name,
                **(extra or {})}

    def _drop_working(self, reason: str) -> None:
        self.working, self.lineage, self.drop_reason = None, self.lineage + 1, reason
        self.line_made = self.line_published = 0
        self.evidence = LineageEvidence()
        if self.live.split:  # the new line's live scores are its own
            self.live.begin_split()

    async def _abandon(self, batch_id: str, reason: str, routine: bool = False) -> None:
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
        if self.canary is not None:
            out["canary"] = self.live.summary(fraction=self.canary.fraction)
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
