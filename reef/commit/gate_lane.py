"""The gate's lane: which weights candidate the gate judges, and when; it emits each outcome.

Training feeds the lane a one-place queue (`offer`): a candidate finished while the gate is
busy waits there, and a newer one, trained on from it, takes its place (the one it replaces is
abandoned as `superseded`: its steps live on in the newer one), so the gate always judges the
newest. The lane judges the waiting candidate in its own task while training goes on, then the
next, and hands each outcome (a verdict, or the failure) to the line that fed it (`Line.settle`).
While none is ready the gate answers its tasks for the serving release ahead (`warm`, the next
verdict's other half), from the first candidate on, or earlier once the learner says the
traffic is thin (`answer_ahead`).

Hold: with `gate_after` above 1, a candidate goes to the gate only once it is that many batches
past the release its line would replace; a nearer one waits for the next, which takes its place
(one a step or two from that release differs from it on a few greedy answers either way and
cannot win, and judging it holds the gate for minutes), unless the learner says the traffic
lags (`unhold`). Every verdict runs to its decision. A candidate of a line the learner dropped
goes to the gate only to be abandoned.
The lane knows nothing of training: the line (`Line`) says which lineage is current, where it
last published, and what to hand the gate with the candidate (whether the learner waits for
samples, the split's live scores).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from reef.core.errors import StaleHead
from reef.core.learned import LearnedCandidate
from reef.core.types import Verdict
from reef.observe import spans

log = logging.getLogger("reef.learner")
Decide = Callable[[LearnedCandidate], Awaitable[Verdict]]  # the gate, then publish or reject
Warm = Callable[[bool], Awaitable[int]]  # (whether the learner waits for samples) -> tasks answered, 0: none left
Queued = tuple[LearnedCandidate, int, int]  # a candidate, its lineage, its position (batches into its line)


@dataclass(frozen=True)
class Outcome:
    """What the gate made of one candidate: a verdict, or why there is none (`error`; StaleHead:
    the head moved while the gate ran)."""

    candidate: LearnedCandidate
    position: int
    verdict: Verdict | None = None
    error: Exception | None = None


class Line(Protocol):  # the learner that feeds the lane (reef.grow.learner.Learner)
    lineage: int  # bumped whenever the line is dropped: candidates of an older lineage are void
    line_published: int  # the position in the line of the release the gate published last
    drop_reason: str

    def starved(self) -> bool: ...
    def for_gate(self, candidate: LearnedCandidate) -> LearnedCandidate: ...
    async def settle(self, outcome: Outcome) -> None: ...
    async def left_gate(self, queued: Queued) -> None: ...
    async def abandon(self, batch_id: str, reason: str, routine: bool = False, metrics: dict | None = None) -> None: ...
    def failed(self, exc: Exception) -> None: ...


class GateLane:
    def __init__(
        self,
        scenario: str,
        decide: Decide,
        span_attributes: Callable[[str], dict],
        *,
        gate_after: int = 1,
        warm: Warm | None = None,
    ) -> None:
        self.scenario = scenario
        self.decide = decide
        self.span_attributes = span_attributes
        self.gate_after = gate_after
        self.warm = warm  # the gate answers its tasks for the serving release while no candidate is ready
        self.line: Line | None = None  # set by the line that feeds the lane
        self.waiting: Queued | None = None  # the next for the gate
        self.at_gate: Queued | None = None  # the one being judged
        self.judging: asyncio.Task[None] | None = None  # the gate's turns, while training goes on
        self.unheld: str | None = None  # a held candidate's batch, sent to the gate as the traffic lags
        self.answered_ahead = False  # whether the gate began answering ahead before the first candidate

    def idle(self) -> bool:
        return self.judging is None or self.judging.done()

    async def offer(self, queued: Queued) -> None:
        """Queue a candidate for the gate, in place of an older one still waiting."""
        assert self.line is not None
        replaced, self.waiting = self.waiting, queued
        if replaced is not None:
            await self.line.abandon(
                replaced[0].batch_id,
                f"superseded: batch {queued[0].batch_id}, trained on from it, goes to the gate instead",
                routine=True,
                metrics=replaced[0].metrics,
            )

    async def go(self) -> None:
        """Start the gate's turns if it is idle (a busy gate takes the waiting candidate next)."""
        if self.idle():
            await self._start_turns()

    async def judge(self, candidate: LearnedCandidate, position: int = 0) -> Outcome:
        """The gate, then publish or reject, as a span `reef.gate`."""
        try:
            with spans.span("reef.gate", self.span_attributes(candidate.batch_id), ok=(StaleHead,)) as span:
                verdict = await self.decide(candidate)
                span.set_attributes(
                    {"reef.gate.decision": verdict.decision, **spans.numeric("reef.gate.", verdict.metrics)}
                )
        except Exception as exc:  # noqa: BLE001 - the line settles it (and raises what is not StaleHead)
            return Outcome(candidate, position, error=exc)
        return Outcome(candidate, position, verdict)

    async def unhold(self) -> None:
        """The traffic lags: the held candidate goes to the gate (its canary must not serve unjudged for good)."""
        if self.waiting is not None and self.idle() and not self._ready():
            self.unheld = self.waiting[0].batch_id
            await self._start_turns()

    def may_answer_ahead(self) -> bool:
        return self.warm is not None and not self.answered_ahead and self.idle() and self.waiting is None

    async def answer_ahead(self) -> None:
        """Before the first candidate, the gate answers its tasks for the serving release."""
        self.answered_ahead = True
        await self._start_turns()

    async def drain(self) -> None:
        """Wait for the gate's turns, if any; a failure there is shown, not raised."""
        task, self.judging = self.judging, None
        if task is None:
            return
        try:
            await task
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged and shown; its batch is abandoned
            log.exception("learner %s: evaluation failed", self.scenario)
            if self.line is not None:
                self.line.failed(exc)

    def cancel(self) -> None:
        if self.judging is not None:
            self.judging.cancel()

    async def _start_turns(self) -> None:
        await self.drain()
        self.judging = asyncio.get_running_loop().create_task(self._turns(), name=f"gate:{self.scenario}")

    def _ready(self) -> bool:
        """Whether the waiting candidate goes to the gate now: one of a dropped line goes (to be
        abandoned); one fewer than `gate_after` batches past the release its line would replace waits."""
        if self.waiting is None or self.line is None:
            return False
        candidate, lineage, position = self.waiting
        return (
            lineage != self.line.lineage
            or position - self.line.line_published >= self.gate_after
            or candidate.batch_id == self.unheld
        )

    async def _turns(self) -> None:
        """Judge the waiting candidate, then the one waiting after it, while one is ready; while
        none is, answer the gate's tasks for the serving release, a chunk at a time."""
        assert self.line is not None
        while True:
            while not self._ready():
                if not await self._warm():  # none left to answer: wait for a candidate
                    return
            assert self.waiting is not None
            queued, self.waiting, self.unheld = self.waiting, None, None
            candidate, lineage, position = queued
            if lineage != self.line.lineage:
                await self.line.abandon(
                    candidate.batch_id, f"trained on from a candidate that was dropped: {self.line.drop_reason}"
                )
                continue
            self.at_gate = queued
            try:
                await self.line.settle(await self.judge(self.line.for_gate(candidate), position))
            except Exception as exc:  # noqa: BLE001 - its batch is abandoned; the next candidate still goes
                log.exception("learner %s: evaluation failed", self.scenario)
                self.line.failed(exc)
            finally:
                self.at_gate = None
                await self.line.left_gate(queued)

    async def _warm(self) -> int:
        """The gate answers some of its tasks for the serving release; how many (0: none left, or failed)."""
        if self.warm is None or self.line is None:
            return 0
        try:
            return int(await self.warm(self.line.starved()) or 0)
        except Exception as exc:  # noqa: BLE001 - the verdict will answer them itself
            log.warning(
                "learner %s: the gate could not answer its tasks ahead: %s: %s", self.scenario, type(exc).__name__, exc
            )
            return 0
