"""OpenClaw-RL: learning from what happens next, with no `/reef/report`.

Every answer is followed by something: the user's next message ("wrong, try again", "thanks,
now...") or the result of the tool it called. That next state says how the answer went. The
recipe reads the scenario's records itself (not only reported ones) and stitches them into
sessions: a record's session is the one its request names (`x-reef-session`, or the agent's own
session header, recorded by the server for every recipe); a request whose messages extend an
earlier request of the scenario (that request's messages plus its answer) is that request's next
turn, found through a hash of the message prefix (one pass over the messages, a dict lookup per
assistant message); in a named session a request that extends none continues the session's
latest turn. A turn that sees no next turn for `session_idle_s` ends its session and is not
trained on (`no_next_state`), unless a report scored it.

The next state of a turn is what came after its answer, up to the next assistant message: the
user's message or the tool results. A judge (an OpenAI- or Anthropic-compatible model; default:
the scenario's own runtime) reads (context, answer, next state), all of it client text fenced as
data (`reef/core/fence.py`), `judge.votes` times, each a vote of +1, -1 or 0; the most common
vote wins and a tie is 0. A reported score on the turn (above `report_pass`: +1, below: -1)
is mixed in with weight `report_weight`. The reward is every token's advantage
(`reward_weight` times it) under the clipped importance-sampling loss (eps 0.2 / 0.28).

Optional hindsight hints (on-policy distillation): the judge also writes a one-line hint; the
teacher (the frozen base, or the serving release's adapter) scores the answer's own tokens
under the prompt with the hint appended, and `hints.weight * (teacher - student)` log-prob per
token is added to the advantage. `turns_per_batch` judged turns make a candidate. A fixed
hash-chosen fraction of turns is judged but kept out of training for the gate's offline check.
docs/learning.md and docs/recipes.md say more.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from dataclasses import dataclass
from functools import cached_property
from itertools import islice
from typing import Callable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from reef.config.training import ClippedLossConfig
from reef.core.chat import ChatRequest, Message, Tool, ToolCall
from reef.core.errors import InvalidInput, NotFound, RuntimeFailure
from reef.core.fence import Fence
from reef.core.training import Datum, LossConfig, Rollout, weights_part
from reef.core.types import JSON, Record, RecordStatus, ReportedRecords
from reef.grow.recipe import Abandon, Job, LearnerView, Made, RecipeContext, held_out
from reef.grow.rollouts import rollout_of, rollout_problem, staleness_problem
from reef.recipes.judge import JudgeConfig, judge_messages, majority, parse_verdict
from reef.recipes.session_turns import client_messages, prefix_digests, turn_key, until_assistant
from reef.runtimes.endpoint import ModelEndpoint

NAME = "openclaw_rl"
HOLDOUT_KEEP = 64
SCAN_LIMIT = 512  # records read per learner step
BASELINE_TURNS = 64  # judged turns the reward baseline averages over


class HintConfig(BaseModel):
    """Hindsight hints: on-policy distillation from a teacher that read the judge's hint."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Ask the judge for a hint; add teacher - student log-probs")
    teacher: Literal["base", "serving"] = Field(
        "base", description="base: the frozen model; serving: the head's adapter"
    )
    weight: float = Field(1.0, ge=0, description="Weight of the per-token teacher - student advantage")
    max_chars: int = Field(300, ge=10, description="Longest hint used")


class OpenClawRLConfig(ClippedLossConfig):
    """Knobs of the `openclaw_rl` recipe: `learner.openclaw_rl` (docs/learning.md explains each);
    the LoRA shape, optimiser and clip range are every weights recipe's (reef/config/training.py)."""

    session_idle_s: float = Field(600.0, gt=0, description="A session ends after this long without a next turn")
    # bench/openclaw_rl.py: 16 turns and 4 steps at 2e-4 trained batches of one right answer or none
    # and published nothing; 32 turns and 2 steps at 1e-4 gained on both seeds (docs/learning.md)
    turns_per_batch: int = Field(32, ge=1, description="Turns with a next state per candidate")
    steps_per_candidate: int = Field(2, ge=1, description="Optimiser steps over a batch before the gate judges it")
    lr: float = Field(1e-4, gt=0, description="AdamW's learning rate")
    reward_weight: float = Field(1.0, ge=0, description="Weight of the judged reward in each token's advantage")
    report_weight: float = Field(0.5, ge=0, le=1, description="Share of a reported score in a turn's reward")
    report_pass: float = Field(0.5, description="A reported score above this is +1, below it -1")
    max_open_turns: int = Field(4096, ge=1, description="Turns waiting for their next state; the oldest go first")
    max_waiting: int = Field(256, ge=1, description="Turns with a next state waiting for a batch; the oldest go first")
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    hints: HintConfig = Field(default_factory=HintConfig)


@dataclass
class Turn:
    """An answered record waiting for what happens next."""

    record: Record
    session: str
    explicit: bool  # its session was named by a header
    at: float  # when it was stored (epoch seconds)
    key: str  # the hash of its messages plus its answer: what its next turn's messages start with


@dataclass(frozen=True)
class Ready:
    """A turn with its next state (empty: resumed, or ended with a report only)."""

    record: Record
    session: str
    next_record_id: str | None
    next_state: tuple[JSON, ...]

    @property
    def record_id(self) -> str:
        return self.record.id

    @cached_property
    def rollout(self) -> Rollout:
        """Its record as the trainer takes it, made once (the judge reads the record itself)."""
        return rollout_of(self.record)


@dataclass(frozen=True)
class TurnBatch:
    turns: list[Ready]
    reports: tuple[str, ...] = ()

    @property
    def record_ids(self) -> list[str]:
        return [t.record_id for t in self.turns]

    @property
    def report_ids(self) -> list[str]:
        return list(self.reports)


@dataclass(frozen=True)
class Judgement:
    reward: float
    votes: tuple[int, ...]
    hint: str | None
    calls: int
    known: bool = True  # False: no vote and no report (the judge failed, or nothing came next)


class OpenClawRLRecipe:
    name = NAME
    surface = "weights"
    harness_gate = None  # judged by the weights gate (learner.gate)
    Settings = OpenClawRLConfig

    def __init__(
        self, config: OpenClawRLConfig, context: RecipeContext | None = None, judge: ModelEndpoint | None = None
    ) -> None:
        self.config = config
        gate = context.gate if context is not None else None
        self.holdout_fraction = gate.holdout_fraction if gate is not None and not gate.tasks else 0.0
        self.runtime = context.runtime if context is not None else None
        if judge is None and self.runtime is not None:
            judge = ModelEndpoint(config.judge, self.runtime)
        self.judge = judge
        self.clock: Callable[[], float] = time.time
        self.seq = 0  # the last record read
        self.started = False
        self.open: dict[str, Turn] = {}  # record id -> turn, in arrival order
        self.by_key: dict[str, list[str]] = {}  # prefix hash -> open turns it continues
        self.latest: dict[str, str] = {}  # named session -> its latest open turn
        self.unfinished: dict[str, tuple[float, str, int]] = {}  # in_progress record -> (stored at, session, seq)
        self.ready: deque[Ready] = deque()
        self.holdout_waiting: deque[Ready] = deque(maxlen=HOLDOUT_KEEP)
        self.holdout: deque[tuple[float, Rollout]] = deque(maxlen=HOLDOUT_KEEP)
        self.reported: dict[str, tuple[str, float]] = {}  # record id -> (report id, score): the latest
        self.view: LearnerView | None = None
        self.counts: Counter[str] = Counter()
        self._calls = asyncio.Semaphore(config.judge.concurrency)

    # -- eligibility: reports (optional) and the scenario's traffic -------------------------------

    def intake(self, items: Sequence[ReportedRecords], view: LearnerView) -> None:
        """Reports are optional here: a reported score joins the judge's vote (`report_weight`)."""
        self.view = view
        for item in items:
            for record in item.records:
                self.reported.pop(record.id, None)
                self.reported[record.id] = (item.report.id, float(item.report.score))
        while len(self.reported) > self.config.max_open_turns:
            self.reported.pop(next(iter(self.reported)))

    def scan(self, view: LearnerView) -> None:
        """Read the records stored since the last scan and stitch them into sessions; end the
        sessions idle for `session_idle_s`. After a start, only the last `session_idle_s` of
        records are read back (older sessions have ended)."""
        self.view = view
        store = view.store
        if store is None:
            return
        now = self.clock()
        since = None if self.started else now - self.config.session_idle_s
        self.started = True
        for stored in islice(
            store.iter_records(view.scenario, after_seq=self.seq, since=since, page_size=256), SCAN_LIMIT
        ):
            self.seq = max(self.seq, stored.record.seq or 0)
            self.arrive(stored.record, stored.created_at, view, stored.session)
        self._settle_earlier(None, view, expire_at=now)
        self.expire(now, view)

    def _settle_earlier(self, before_seq: int | None, view: LearnerView, expire_at: float | None = None) -> bool:
        """Re-read the records that were still streaming when read (all, or those stored before
        `before_seq`): the finished ones open as turns, so a next turn read before its previous
        one finished still finds it. True when one opened."""
        opened = False
        for record_id, (at, session, seq) in list(self.unfinished.items()):
            if before_seq is not None and seq >= before_seq:
                continue
            try:
                record = view.store.get_record(record_id)  # type: ignore[union-attr]
            except NotFound:
                del self.unfinished[record_id]
                view.drop("compacted_or_missing")
                continue
            if record.status is not RecordStatus.IN_PROGRESS:
                del self.unfinished[record_id]
                self._open(record, at, session, view)
                opened = True
            elif expire_at is not None and expire_at - at > self.config.session_idle_s:
                del self.unfinished[record_id]
                view.drop("not_complete")
        return opened

    def arrive(self, record: Record, at: float, view: LearnerView, stored_session: str | None = None) -> None:
        """One record, in store order: the next turn of an open one, and (once answered) open itself.
        `stored_session` is the store's session of the record: the one its request named, or the
        one an earlier scan stitched it into (kept in the store, so a restart stitches alike)."""
        messages = client_messages(record)
        previous, next_state = self._previous(record, messages)
        if previous is None and self._settle_earlier(record.seq or 0, view):
            previous, next_state = self._previous(record, messages)
        session = (
            record.session or stored_session or (previous.session if previous is not None else f"stitched:{record.id}")
        )
        if record.session is None and stored_session is None:
            self._keep_stitched(record.id, session, view)
        if previous is not None:
            self._follow(previous, record.id, next_state, view)
        if record.status is RecordStatus.IN_PROGRESS:
            self.unfinished[record.id] = (at, session, record.seq or 0)
            return
        self._open(record, at, session, view)

    def _keep_stitched(self, record_id: str, session: str, view: LearnerView) -> None:
        try:
            view.store.stitch_session(record_id, session)  # type: ignore[union-attr]
        except InvalidInput:  # a session id too long to store (a long client-chosen record id)
            self.counts["stitch_unstored"] += 1

    def _previous(self, record: Record, messages: list[JSON]) -> tuple[Turn | None, tuple[JSON, ...]]:
        """The open turn `record` continues and the messages that followed its answer."""
        for index, digest in reversed(prefix_digests(messages)):
            turns = [self.open[i] for i in self.by_key.get(digest, ()) if i in self.open]
            turns = [
                t
                for t in turns
                if (t.record.seq or 0) < (record.seq or 0)
                and not (record.session and t.explicit and t.session != record.session)
            ]
            if not turns:
                continue
            same = [t for t in turns if record.session and t.session == record.session]
            next_state = until_assistant(messages[index + 1 :])
            if next_state:
                return (same or turns)[0], next_state
        if record.session and record.session in self.latest:
            turn = self.open.get(self.latest[record.session])
            last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
            trailing = tuple(messages[last + 1 :])
            if turn is not None and (turn.record.seq or 0) < (record.seq or 0) and trailing:
                return turn, trailing
        return None, ()

    def _open(self, record: Record, at: float, session: str, view: LearnerView) -> None:
        if record.status is not RecordStatus.COMPLETE or record.response is None:
            return  # an answer that did not finish has no next state to learn from
        key = turn_key(client_messages(record), record.response)
        self.open[record.id] = Turn(record, session, record.session is not None, at, key)
        self.by_key.setdefault(key, []).append(record.id)
        if record.session is not None:
            self.latest[record.session] = record.id
        while len(self.open) > self.config.max_open_turns:
            self._close(next(iter(self.open)))
            view.drop("open_turns_full")

    def _close(self, record_id: str) -> Turn:
        turn = self.open.pop(record_id)
        ids = self.by_key.get(turn.key, [])
        if record_id in ids:
            ids.remove(record_id)
        if not ids:
            self.by_key.pop(turn.key, None)
        if self.latest.get(turn.session) == record_id:
            del self.latest[turn.session]
        return turn

    def _follow(self, turn: Turn, next_record_id: str | None, next_state: tuple[JSON, ...], view: LearnerView) -> None:
        """`turn` has its next state (or ended with a report): waiting for a batch, if it can train."""
        self._close(turn.record.id)
        record = turn.record
        problem = rollout_problem(record, view.consumed)
        if problem is None and record.release is not None:
            problem = staleness_problem(record.release.release_id, view, self.config.max_staleness)
        if problem is not None:
            view.drop(problem)
            return
        ready = Ready(record, turn.session, next_record_id, next_state)
        if held_out(record.id, self.holdout_fraction):
            self.holdout_waiting.append(ready)
            return
        self.ready.append(ready)
        while len(self.ready) > self.config.max_waiting:
            self.ready.popleft()
            view.drop("superseded")

    def expire(self, now: float, view: LearnerView) -> None:
        """End the sessions idle for `session_idle_s`: their last turn has no next state."""
        for record_id in list(self.open):
            turn = self.open[record_id]
            if now - turn.at <= self.config.session_idle_s:
                break  # arrival order: the rest are younger
            if record_id in self.reported:  # a report scored it: that is signal enough
                self._follow(turn, None, (), view)
            else:
                self._close(record_id)
                view.drop("no_next_state")

    # -- batches ------------------------------------------------------------------------------

    async def next_batch(self, view: LearnerView) -> TurnBatch | None:
        self.scan(view)
        if len(self.ready) < self.config.turns_per_batch:
            return None
        turns = [self.ready.popleft() for _ in range(self.config.turns_per_batch)]
        reports = tuple(sorted({self.reported[t.record_id][0] for t in turns if t.record_id in self.reported}))
        return TurnBatch(turns, reports)

    def resume(self, items: Sequence[ReportedRecords]) -> TurnBatch:
        """A logged batch whose turns were all reported: trained from the reports alone (the next
        states were in memory; a batch with unreported turns is abandoned by the learner)."""
        for item in items:
            self.reported[item.records[0].id] = (item.report.id, float(item.report.score))
        return TurnBatch(
            [Ready(item.records[0], "resumed", None, ()) for item in items],
            tuple(sorted({item.report.id for item in items})),
        )

    def high_water(self, cursor: int) -> int:
        return cursor  # reports only add to turns already waiting here

    # -- the candidate --------------------------------------------------------------------------

    async def candidate(self, batch: TurnBatch, job: Job) -> Made:
        assert job.trainer is not None
        c = self.config
        started = time.monotonic()
        holdout = list(self.holdout_waiting)
        self.holdout_waiting.clear()
        judged = await asyncio.gather(*(self.judgement(t, job) for t in [*batch.turns, *holdout]))
        for turn, j in zip(holdout, judged[len(batch.turns) :]):
            self.holdout.append((j.reward, turn.rollout))
        hints = await self._hint_advantages(batch.turns, judged[: len(batch.turns)], job) if c.hints.enabled else {}
        state = job.algorithm_state
        baseline = float(state.get("reward_baseline", 0.0))
        data, rewards = [], []
        for turn, j in zip(batch.turns, judged):
            if not j.known:
                continue  # counted as judge_failed or no_next_state
            datum = self._datum(turn, j.reward - baseline, hints.get(turn.record_id))
            if datum is None:
                self.drops_of().drop("neutral")
                continue
            data.append(datum)
            rewards.append(j.reward)
        calls = sum(j.calls for j in judged)
        state.update(updated_baseline(state, [j.reward for j in judged if j.known]))
        state["judge_calls"] = int(state.get("judge_calls", 0)) + calls
        if not data:
            raise Abandon(
                "no_signal",
                f"every turn of the batch was judged 0 against the baseline {baseline:+.2f} ({calls} judge calls)",
            )
        await job.trainer.load_state(job.start, c.lora)
        metrics: dict[str, float] = {}
        for _ in range(c.steps_per_candidate):
            metrics = await job.trainer.forward_backward(
                data, "clipped_is", LossConfig(c.eps_clip, c.eps_clip_high, c.kl_coef)
            )
            metrics.update(await job.trainer.optim_step(c.adam))
        state["turns_trained"] = int(state.get("turns_trained", 0)) + len(data)
        self.counts["turns_trained"] += len(data)
        self.counts["last_candidate_ms"] = int((time.monotonic() - started) * 1000)
        votes = Counter(v for j in judged[: len(batch.turns)] for v in j.votes)
        return Made(
            await job.trainer.save_state(),
            metrics={
                "training": metrics,
                "turns": len(data),
                "judge_calls": calls,
                "rewards": rewards,
                "baseline": baseline,
                "votes": {str(k): n for k, n in sorted(votes.items())},
                "hinted": len(hints),
            },
            held_out=list(self.holdout),
        )

    def _datum(self, turn: Ready, reward: float, distill: list[float] | None) -> Datum | None:
        advantages = [self.config.reward_weight * reward] * len(turn.rollout.completion_ids)
        if distill is not None:
            advantages = [a + self.config.hints.weight * d for a, d in zip(advantages, distill)]
        if not any(advantages):
            return None
        return turn.rollout.datum(advantages)

    async def judgement(self, turn: Ready, job: Job) -> Judgement:
        """The turn's reward: the judge's majority vote, mixed with a reported score if any."""
        c = self.config
        report = self.reported.get(turn.record_id)
        report_reward = None if report is None else float((report[1] > c.report_pass) - (report[1] < c.report_pass))
        votes: tuple[int, ...] = ()
        hint = None
        calls = 0
        if turn.next_state and not (report_reward is not None and c.report_weight >= 1):
            asked = await asyncio.gather(*(self._vote(turn, job) for _ in range(c.judge.votes)))
            calls = len(asked)
            votes = tuple(v for v, _ in asked if v is not None)
            hint = next((h for v, h in asked if h), None)
        judge_reward = float(majority(votes)) if votes else None
        if judge_reward is None and report_reward is None:
            if calls:
                self.drops_of().drop("judge_failed")
            else:
                self.drops_of().drop("no_next_state")
            return Judgement(0.0, votes, None, calls, known=False)
        if report_reward is None:
            reward = judge_reward
        elif judge_reward is None:
            reward = report_reward
        else:
            reward = (1 - c.report_weight) * judge_reward + c.report_weight * report_reward
        return Judgement(float(reward or 0.0), votes, hint, calls)

    async def _vote(self, turn: Ready, job: Job) -> tuple[int | None, str | None]:
        """One judge call: (+1 / -1 / 0, or None when it failed; the hint, if asked and given)."""
        if self.judge is None:
            raise Abandon("no_judge", "the recipe has no judge (no runtime and no judge.url)")
        messages = judge_messages(turn.record, turn.next_state, self.config.judge, Fence(), self.config.hints.enabled)
        async with self._calls:
            self.counts["judge_calls"] += 1
            try:
                answer = await self.judge.ask(messages, job.serving)
            except RuntimeFailure:
                self.counts["judge_failures"] += 1
                return None, None
        vote, hint = parse_verdict(answer)
        if vote is None:
            self.counts["judge_unparsed"] += 1
            vote = 0  # an answer without a verdict abstains
        return vote, (hint[: self.config.hints.max_chars] if hint and self.config.hints.enabled else None)

    async def _hint_advantages(
        self, turns: list[Ready], judged: Sequence[Judgement], job: Job
    ) -> dict[str, list[float]]:
        """Per hinted turn: teacher (hinted prompt) minus student (as sampled) log-prob per token."""
        prompt_ids = getattr(self.runtime, "prompt_ids", None)
        hinted = [(t, j.hint) for t, j in zip(turns, judged) if j.hint]
        if not hinted or prompt_ids is None or job.trainer is None:
            return {}
        teacher = weights_part(job.head_files) if self.config.hints.teacher == "serving" else None
        out: dict[str, list[float]] = {}
        for turn, hint in hinted:
            rollout = turn.rollout
            try:
                ids = prompt_ids(hinted_request(turn.record, hint or ""))
            except Exception:  # noqa: BLE001 - a request the template cannot render again: no hint
                self.counts["hint_failures"] += 1
                continue
            scores = (await job.trainer.logprobs([(ids, rollout.completion_ids)], teacher, rollout.temperature))[0]
            out[turn.record_id] = [t - s for t, s in zip(scores, rollout.behaviour_logprobs)]
        self.counts["hinted"] += len(out)
        return out

    def drops_of(self) -> LearnerView | _Drops:
        """Where a reason found while judging is counted: the learner's view (its status)."""
        return self.view if self.view is not None else _Drops(self.counts)

    def status(self) -> JSON:
        return {
            "open_turns": len(self.open),
            "waiting_turns": len(self.ready),
            "held_out": len(self.holdout),
            "judge_calls": self.counts["judge_calls"],
            "judge_failures": self.counts["judge_failures"],
            "turns_trained": self.counts["turns_trained"],
        }

    async def close(self) -> None:
        if self.judge is not None:
            await self.judge.close()


def updated_baseline(state: JSON, rewards: Sequence[float]) -> dict[str, float]:
    """The running mean of judged rewards that the next batch's rewards are measured against.

    Without it, when nearly every turn is judged bad every candidate only moves away from what it
    said and the gate rejects them all; against the mean, the rare good turn stands out. The mean
    covers about the last `BASELINE_TURNS` judged turns and never the batch it is applied to (a
    baseline that depends on the sample would bias the gradient). It lives in the line's algorithm
    state, so it survives restarts."""
    mean = float(state.get("reward_baseline", 0.0))
    count = int(state.get("reward_baseline_turns", 0))
    for reward in rewards:
        count = min(count + 1, BASELINE_TURNS)
        mean += (reward - mean) / count
    return {"reward_baseline": mean, "reward_baseline_turns": count}


class _Drops:
    def __init__(self, counts: Counter[str]) -> None:
        self.counts = counts

    def drop(self, reason: str, n: int = 1) -> None:
        self.counts[reason] += n


# -- hints ---------------------------------------------------------------------------------------


def hinted_request(record: Record, hint: str) -> ChatRequest:
    """The request the record's answer continued (as sent, harness included), the hint appended
    to its last user or tool message: the teacher's prompt."""
    request = record.request or {}
    messages = [
        Message(
            m.get("role", "user"),
            m.get("content") or "",
            tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in m.get("tool_calls") or ()),
            m.get("tool_call_id"),
            m.get("name"),
        )
        for m in request.get("messages") or ()
    ]
    note = f"\n\n(Hint, in hindsight: {hint})"
    if messages and messages[-1].role in ("user", "tool"):
        last = messages[-1]
        messages[-1] = Message(last.role, last.content + note, last.tool_calls, last.tool_call_id, last.name)
    else:
        messages.append(Message("user", note.strip()))
    tools = tuple(Tool(t["name"], t.get("description"), t.get("parameters") or {}) for t in request.get("tools") or ())
    return ChatRequest(
        model=str(request.get("model") or ""),
        messages=tuple(messages),
        dialect=request.get("dialect") or "openai",
        tools=tools,
        tool_choice=request.get("tool_choice"),
    )
