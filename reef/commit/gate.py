"""The weights gate: a candidate adapter is published only if it beats the serving release.

With evaluation tasks and a scorer configured, candidate and current release answer the same
tasks with the same seeds on the serving runtime, and the candidate is selected only when its
mean score gain reaches `margin` and a one-sided paired sign test over the tasks gives
confidence `confidence` that it wins more often than it loses. The test is sequential: the
tasks are answered in `looks` parts (in a shuffled order drawn for each candidate from its
content id, so every part mixes the task file's kinds and no task subset is every candidate's
first look), and after each part but the last the gate may decide early: select when the
sign test already passes at a stricter level, reject when the candidate is already losing (the
sign test the other way at FUTILE_P). The selection level is split across the looks (a quarter of `1 - confidence` over the
early ones, the rest at the end), so deciding early adds no chance of selecting a candidate
that is no better (union bound); stopping to reject never selects anything. Without tasks, an offline check
on held-out reported records: the candidate must not make well-scored responses less likely,
nor badly scored ones more likely, by more than `offline_bound` nats per token. Either way the
verdict carries its metrics (per-task results included) into the release chain. The gate's
requests share the serving runtime with live traffic: `concurrency` bounds how many are in flight,
at every verdict or (`concurrency_when: starved`) only when the learner says it waits for samples.
The serving release's answers are kept per task (answers are greedy and seeded), and `warm`
answers the rest of them while the gate waits for a candidate. With `halves`, the tasks are split
in two fixed halves and a candidate is judged on the half its serving release was not selected
on (the base: the first half), so no head is measured again on the tasks that picked it; each
verdict records its `half`, and the publisher hands the chain's verdicts back after a restart.
With `halves: after_first` a release no half chose (the base) is judged on every task, as
without halves, so the first selection needs no more margin; its successors are then judged on
the first half, and from the next selection on each head on the half that did not choose it.
`live`: with `live_split`, the learner hands over the live scores of the candidate's line and
of the serving release, served side by side; each look's sign test is then one test of both
(`reef.core.live_evidence`).
With `answer_on: trainer` the tasks are answered greedily in the training process (the worker's
`generate`, from each release's adapter files) instead of on the serving runtime: a verdict then
takes no turns from live traffic, and uses the time the trainer waits for samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

from reef.config import GateConfig
from reef.core.chat import ChatRequest, ChatResult, Message
from reef.core.dotted import load_dotted
from reef.core.errors import InvalidInput
from reef.core.live_evidence import LiveEvidence, combined_p, tasks_share_p
from reef.core.sign_test import sign_test_p
from reef.core.training import Rollout, weights_part
from reef.core.types import Release, ReleaseRef, Verdict
from reef.runtimes.base import Runtime
from reef.runtimes.chatml import MAX_CONTEXT

Scorer = Callable[[dict[str, Any], str], float]
MIN_HOLDOUT_EACH = 2
# Tasks the serving release answers ahead per call of `warm`: a candidate made meanwhile waits
# for at most this many answers (with 174 tasks, warming them all held the first verdict a minute).
WARM_CHUNK = 8
# Tasks one job of the training process answers (`answer_on: trainer`), and so its chunk ahead: the
# trainer decodes 16 rows together, and a job of 16 gives 1.2-1.3x the answers a second of a job of
# 8 (the same text; bench/gate_jobs.py), in the same share of the trainer's time.
TRAINER_JOB = 16
FUTILE_P = 0.25  # an early look rejects a candidate whose losses are this significant (the sign test reversed)
# `halves: after_first`: a verdict against a release no half chose asks every task (its `half`)
EVERY_TASK = -1


class TrainingProcess(Protocol):  # the training process's scoring and answers (`reef.grow.worker.TrainingWorker`)
    async def logprobs(
        self, adapter_files: dict[str, bytes] | None, sequences: list[tuple[list[int], list[int]]]
    ) -> list[list[float]]: ...

    async def generate(
        self, adapter_files: dict[str, bytes] | None, requests: list[ChatRequest], max_tokens: int
    ) -> list[str]: ...


class WeightsGate:
    def __init__(self, config: GateConfig, runtime: Runtime, worker: TrainingProcess) -> None:
        self.config = config
        self.runtime = runtime
        self.worker = worker
        self.tasks, self.scorer = load_gate_tasks(config)
        self.halves = split_halves(len(self.tasks))
        self._selected_on: dict[str, int] = {}  # content_id -> the half its select verdict asked (halves only)
        self._scores: dict[str, dict[int, float]] = {}  # content_id -> task index -> score (deterministic)
        self._in_flight = asyncio.Semaphore(config.concurrency) if config.concurrency else None
        self._files: dict[str, dict[str, bytes]] = {}  # content_id -> its files (answer_on: trainer)

    async def judge(
        self,
        current: ReleaseRef,
        current_files: Mapping[str, bytes],
        candidate_id: str,
        candidate_files: Mapping[str, bytes],
        holdout: Sequence[tuple[float, Rollout]],
        starved: bool = False,
        live: LiveEvidence | None = None,
        thresholds: Mapping[str, Any] | None = None,
    ) -> Verdict:
        """`thresholds`: `margin` and `confidence` an operator changed live, over the config's.
        `starved`: the learner waits for samples, so with `concurrency_when: starved` the
        gate's requests are bounded by `concurrency`, leaving the runtime to live traffic.
        `live`: the candidate's line served side by side with `current` (`live_split`): its live
        scores join the tasks' sign test (only when they are of `current`)."""
        if self.tasks:
            bounded = self.config.concurrency_when == "always" or starved
            if live is not None and live.serving_release_id != current.release_id:
                live = None
            self.know_files(current, current_files)
            config = self.config.model_copy(update=dict(thresholds)) if thresholds else self.config
            return await self._on_tasks(current, candidate_id, candidate_files, bounded, live, config)
        return await self._offline(current_files, candidate_files, holdout)

    def remember(self, releases: Sequence[Release]) -> None:
        """Learn from the chain which half selected each release (after a restart, a rollback)."""
        for release in releases:
            verdict = release.verdict
            if verdict is not None and verdict.decision == "select" and isinstance(verdict.metrics.get("half"), int):
                self._selected_on[release.ref.content_id] = verdict.metrics["half"]

    @property
    def answers_from_files(self) -> bool:
        """Whether the tasks are answered from a release's files (in the training process), so
        `warm` needs the serving release's files (`know_files`) as well as its runtime load."""
        return bool(self.tasks) and self.config.answer_on == "trainer"

    async def check_lengths(self) -> None:
        """Refuse (InvalidInput) a task whose prompt fills the context it is answered in: the
        training process's with `answer_on: trainer`, else the runtime's where it has one. Every
        verdict would otherwise fail on it, and every candidate be abandoned."""
        context = MAX_CONTEXT if self.answers_from_files else getattr(self.runtime, "max_context", None)
        if not self.tasks or not isinstance(context, int):
            return
        for index in range(len(self.tasks)):
            tokens = await self.runtime.count_tokens(self._request(index))
            if tokens >= context:
                raise InvalidInput(
                    f"gate task {index + 1} of {len(self.tasks)} in {self.config.tasks} has a "
                    f"{tokens}-token prompt; the model's context is {context} tokens, prompt and "
                    f"answer together: shorten it or leave it out"
                )

    def know_files(self, release: ReleaseRef, files: Mapping[str, bytes]) -> None:
        if self.answers_from_files:
            self._files = {release.content_id: dict(files)}  # only the serving release's are kept

    def knows_files(self, release: ReleaseRef) -> bool:
        return release.content_id in self._files

    def judged_on(self, current: ReleaseRef) -> tuple[int | None, list[int]]:
        """The half (None: no halves; EVERY_TASK: every task) and the task indices a candidate
        against `current` answers."""
        if not self.config.halves:
            return None, list(range(len(self.tasks)))
        chose = self._selected_on.get(current.content_id)
        if chose is None and self.config.halves == "after_first":
            return EVERY_TASK, list(range(len(self.tasks)))  # no half chose it: a full verdict, a fast start
        half = 1 if chose == 0 else 0
        return half, self.halves[half]

    @property
    def chunk(self) -> int:
        """Tasks answered a call of `warm`, and a job of the training process."""
        return TRAINER_JOB if self.answers_from_files else WARM_CHUNK

    async def warm(
        self,
        current: ReleaseRef,
        starved: bool = False,
        limit: int | None = None,
        *,
        files: Callable[[], Awaitable[Mapping[str, bytes]]] | None = None,
    ) -> int:
        """Answer up to `limit` (default: `chunk`) of the tasks the serving release has not answered yet (with the
        bound a verdict would have): the next verdict then asks only its candidate. For the learner
        to call again and again while the gate has nothing to judge, so that a candidate made
        meanwhile waits for one chunk, not for every task; the number answered (0: nothing left
        to answer, or no tasks). `files`: reads the serving release's files, which answering on
        the trainer needs (once per release)."""
        if not self.tasks:
            return 0
        if self.answers_from_files and not self.knows_files(current) and files is not None:
            self.know_files(current, await files())
        known = self._scores.setdefault(current.content_id, {})
        todo = [i for i in self.judged_on(current)[1] if i not in known][: self.chunk if limit is None else limit]
        bounded = self.config.concurrency_when == "always" or starved
        known.update(
            zip(todo, await self._answer(current.runtime_load_id, self._files.get(current.content_id), todo, bounded))
        )
        return len(todo)

    # -- evaluation tasks ------------------------------------------------------------------------

    async def _on_tasks(
        self,
        current: ReleaseRef,
        candidate_id: str,
        files: Mapping[str, bytes],
        bounded: bool,
        live: LiveEvidence | None,
        config: GateConfig | None = None,
    ) -> Verdict:
        config = config or self.config
        known = self._scores.setdefault(current.content_id, {})
        before: list[float] = []
        after: list[float] = []
        asked: list[int] = []  # task indices, in the order before and after hold them
        mine = self._scores.setdefault(candidate_id, {})  # kept: once published, it is the current release
        half, tasks = self.judged_on(current)
        load_id = None if self.answers_from_files else await self.runtime.load(candidate_id, files)
        current_files = self._files.get(current.content_id)
        try:
            parts = look_parts(tasks, self.config.looks, candidate_id)
            for look, part in enumerate(parts, 1):
                todo = [i for i in part if i not in known]
                current_answers, candidate_answers = await asyncio.gather(
                    self._answer(current.runtime_load_id, current_files, todo, bounded),
                    self._answer(load_id, files, part, bounded),
                )
                known.update(zip(todo, current_answers))
                mine.update(zip(part, candidate_answers))
                before += [known[i] for i in part]
                after += candidate_answers
                asked += part
                verdict = sequential_verdict(before, after, config, look, len(parts), asked, live=live)
                if verdict is not None:
                    verdict.metrics["in_flight_bound"] = self.config.concurrency if bounded else None
                    if half is not None:
                        verdict.metrics["half"] = half
                        if verdict.decision == "select":
                            self._selected_on[candidate_id] = half
                    return verdict
        finally:
            if load_id is not None:
                await self.runtime.unload(load_id)
        raise AssertionError("the last look always decides")  # pragma: no cover

    async def _answer(
        self, load_id: str | None, files: Mapping[str, bytes] | None, indices: list[int], bounded: bool
    ) -> list[float]:
        """The scores of these tasks' answers from one runtime load (seeded by task index), or,
        answering on the trainer, from the release's `files` in one job of the training process;
        `bounded`: at most `concurrency` of the gate's requests in flight on the runtime."""
        assert self.scorer is not None
        if self.answers_from_files:
            if not indices:
                return []
            adapter, texts = weights_part(files), []
            for start in range(0, len(indices), TRAINER_JOB):  # short jobs: training waits for one at most
                chunk = indices[start : start + TRAINER_JOB]
                texts += await self.worker.generate(adapter, [self._request(i) for i in chunk], self.config.max_tokens)
            return [float(self.scorer(self.tasks[i], text)) for i, text in zip(indices, texts)]  # type: ignore[misc]
        release = ReleaseRef("gate", "gate", load_id)

        async def one(index: int) -> float:
            task = self.tasks[index]
            request = self._request(index)
            result = ChatResult()
            async with self._in_flight if bounded and self._in_flight else contextlib.nullcontext():
                async for delta in self.runtime.generate(request, release):
                    result.add(delta)
            return float(self.scorer(task, result.text))  # type: ignore[misc]

        return list(await asyncio.gather(*(one(i) for i in indices)))

    def _request(self, index: int) -> ChatRequest:
        return ChatRequest(
            model="gate",
            messages=_messages(self.tasks[index]),
            dialect="openai",
            stream=False,
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
            seed=index,
        )

    # -- offline check ------------------------------------------------------------------------------

    async def _offline(
        self,
        current_files: Mapping[str, bytes],
        candidate_files: Mapping[str, bytes],
        holdout: Sequence[tuple[float, Rollout]],
    ) -> Verdict:
        if not holdout:
            return Verdict("reject", {"gate": "offline", "reason": "no held-out reported records yet"})
        mean_score = sum(score for score, _ in holdout) / len(holdout)
        good = [s for score, s in holdout if score > mean_score]
        bad = [s for score, s in holdout if score < mean_score]
        if len(good) < MIN_HOLDOUT_EACH or len(bad) < MIN_HOLDOUT_EACH:
            return Verdict(
                "reject",
                {
                    "gate": "offline",
                    "reason": f"need {MIN_HOLDOUT_EACH} well- and badly-scored "
                    f"held-out records, have {len(good)} and {len(bad)}",
                },
            )
        good_drift = await self._drift(current_files, candidate_files, good)
        bad_drift = await self._drift(current_files, candidate_files, bad)
        bound = self.config.offline_bound
        ok = good_drift >= -bound and bad_drift <= bound
        metrics = {
            "gate": "offline",
            "good_drift": good_drift,
            "bad_drift": bad_drift,
            "bound": bound,
            "good": len(good),
            "bad": len(bad),
        }
        return Verdict("select" if ok else "reject", metrics)

    async def _drift(
        self, current: Mapping[str, bytes], candidate: Mapping[str, bytes], samples: list[Rollout]
    ) -> float:
        """Mean over samples of the change in mean log-prob per token, candidate minus current."""
        sequences = [(s.prompt_ids, s.completion_ids) for s in samples]
        before = await self.worker.logprobs(dict(current) or None, sequences)
        after = await self.worker.logprobs(dict(candidate), sequences)
        per_sample = [_mean(a) - _mean(b) for a, b in zip(after, before)]
        return _mean(per_sample)


def split_halves(n: int) -> tuple[list[int], list[int]]:
    """Task indices 0..n-1 in two fixed halves, each mixing the task file's kinds."""
    order = list(range(n))
    random.Random("halves").shuffle(order)
    return sorted(order[0::2]), sorted(order[1::2])


def look_parts(tasks: Sequence[int], looks: int, seed: str) -> list[list[int]]:
    """Task indices `tasks` in an order shuffled by `seed` (the candidate's content id), cut into `looks`
    parts of (nearly) equal size. Per candidate, not fixed: with one order for all, a release
    selected at the first look is the candidate that did best on exactly those tasks (by luck as
    well as merit), and every successor met them first and was rejected there. The order never
    depends on outcomes, so the sequential sign test keeps its level."""
    order = list(tasks)
    random.Random(seed).shuffle(order)
    n = len(order)
    looks = max(1, min(looks, n))
    bounds = [round(n * k / looks) for k in range(looks + 1)]
    return [order[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def sequential_verdict(
    before: list[float],
    after: list[float],
    config: GateConfig,
    look: int,
    looks: int,
    tasks: Sequence[int] | None = None,
    live: LiveEvidence | None = None,
) -> Verdict | None:
    """The verdict at look `look` of `looks` (None: answer the next part). At the last look the
    full test at the final level; before it, select only at the early level, reject only a
    candidate already losing (`p_worse` <= FUTILE_P: 2-6 is losing, 5-6 is a tie to look further at)."""
    alpha = 1 - config.confidence
    early_alpha = alpha / 4 / (looks - 1) if looks > 1 else 0.0
    final = look >= looks
    level = alpha - early_alpha * (looks - 1) if final else early_alpha
    verdict = paired_verdict(before, after, config.margin, 1 - level, tasks, live)
    verdict.metrics.update(look=look, looks=looks, early=not final)
    if final or verdict.decision == "select":
        return verdict
    return verdict if verdict.metrics["p_worse"] <= FUTILE_P else None


def paired_verdict(
    before: list[float],
    after: list[float],
    margin: float,
    confidence: float,
    tasks: Sequence[int] | None = None,
    live: LiveEvidence | None = None,
) -> Verdict:
    """Select when the mean gain reaches `margin` and the sign test says wins beat losses.
    `tasks`: each pair's index in the task file, kept in `per_task` (as `index`). `live`: the
    line's live scores against the serving release's join the sign test (one combined test, see
    `reef.core.live_evidence`); the tasks must then bring at least half the evidence themselves
    (`tasks_share_p`): live scores are the client's, and can never carry a tie on the tasks."""
    diffs = [a - b for a, b in zip(after, before)]
    wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    p_tasks = sign_test_p(wins, losses)
    p_value = p_tasks if live is None else combined_p(wins, losses, live)
    gain = _mean(diffs)
    leaning = wins > losses if live is None else p_tasks <= tasks_share_p(1 - confidence)
    ok = leaning and gain >= margin and p_value <= 1 - confidence
    metrics = {
        "gate": "tasks",
        "n": len(diffs),
        "wins": wins,
        "losses": losses,
        "ties": len(diffs) - wins - losses,
        "current_score": _mean(before),
        "candidate_score": _mean(after),
        "gain": gain,
        "p_value": p_value,
        **({"p_tasks": p_tasks, "live": live.to_json()} if live is not None else {}),
        "p_worse": sign_test_p(losses, wins),  # the same test the other way: is the candidate worse?
        "margin": margin,
        "confidence": confidence,
        "current_success": _mean([float(b >= 1.0) for b in before]),
        "candidate_success": _mean([float(a >= 1.0) for a in after]),
        "per_task": [
            {"current": b, "candidate": a, **({"index": tasks[i]} if tasks is not None else {})}
            for i, (b, a) in enumerate(zip(before, after))
        ],
    }
    return Verdict("select" if ok else "reject", metrics)


def load_gate_tasks(config: GateConfig) -> tuple[list[dict[str, Any]], Scorer | None]:
    """The tasks and scorer a gate config names, checked (InvalidInput says what is wrong): for
    `reef serve` to refuse a bad setting at start, not when a learner first builds its gate."""
    tasks = load_tasks(config.tasks) if config.tasks else []
    scorer = load_scorer(config.scorer) if config.scorer else None
    if tasks and scorer is None:
        raise InvalidInput("learner.gate.tasks needs learner.gate.scorer (module:function)")
    if config.halves and len(tasks) < 2:
        raise InvalidInput(f"learner.gate.halves needs at least two tasks (learner.gate.tasks), {len(tasks)} given")
    return tasks, scorer


def load_tasks(path: Path) -> list[dict[str, Any]]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise InvalidInput(f"cannot read gate tasks {path}: {exc}") from None
    tasks = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
            _messages(task)
        except (ValueError, InvalidInput) as exc:
            raise InvalidInput(f"{path}:{number}: {exc}") from None
        tasks.append(task)
    if not tasks:
        raise InvalidInput(f"gate tasks file {path} holds no tasks")
    return tasks


def load_scorer(dotted: str) -> Scorer:
    scorer = load_dotted(dotted, "scorer", "module:function")
    if not callable(scorer):
        raise InvalidInput(f"scorer {dotted!r} is not callable")
    return scorer


def _messages(task: Any) -> tuple[Message, ...]:
    if not isinstance(task, dict):
        raise InvalidInput("each task must be a JSON object")
    if isinstance(task.get("prompt"), str):
        return (Message("user", task["prompt"]),)
    messages = task.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("a task needs 'prompt' (text) or 'messages' (a list of {role, content})")
    return tuple(Message(m["role"], m["content"]) for m in messages)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
