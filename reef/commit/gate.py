"""The weights gate: a candidate adapter is published only if it beats the serving release.

With evaluation tasks and a scorer configured, candidate and current release answer the same
tasks with the same seeds on the serving runtime, and the candidate is selected only when its
mean score gain reaches `margin` and a one-sided paired sign test over the tasks gives
confidence `confidence` that it wins more often than it loses. Without tasks, an offline check
on held-out reported records: the candidate must not make well-scored responses less likely,
nor badly scored ones more likely, by more than `offline_bound` nats per token. Either way the
verdict carries its metrics (per-task results included) into the release chain.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from reef.config import GateConfig
from reef.core.chat import ChatRequest, ChatResult, Message
from reef.core.dotted import load_dotted
from reef.core.errors import InvalidInput
from reef.core.types import ReleaseRef, Verdict
from reef.core.training import Sample
from reef.runtimes.base import Runtime

Scorer = Callable[[dict[str, Any], str], float]
MIN_HOLDOUT_EACH = 2


class LogProbs(Protocol):  # the training process's scoring (`reef.grow.worker.TrainingWorker`)
    async def logprobs(self, adapter_files: dict[str, bytes] | None,
                       sequences: list[tuple[list[int], list[int]]]) -> list[list[float]]: ...


class WeightsGate:
    def __init__(self, config: GateConfig, runtime: Runtime, worker: LogProbs) -> None:
        self.config = config
        self.runtime = runtime
        self.worker = worker
        self.tasks = load_tasks(config.tasks) if config.tasks else []
        self.scorer = load_scorer(config.scorer) if config.scorer else None
        if self.tasks and self.scorer is None:
            raise InvalidInput("learner.gate.tasks needs learner.gate.scorer (module:function)")
        self._scores: dict[str, list[float]] = {}  # content_id -> task scores (deterministic per content)

    async def judge(self, current: ReleaseRef, current_files: Mapping[str, bytes], candidate_id: str,
                    candidate_files: Mapping[str, bytes], holdout: Sequence[tuple[float, Sample]]) -> Verdict:
        if self.tasks:
            return await self._on_tasks(current, candidate_id, candidate_files)
        return await self._offline(current_files, candidate_files, holdout)

    # -- evaluation tasks ------------------------------------------------------------------------

    async def _on_tasks(self, current: ReleaseRef, candidate_id: str, files: Mapping[str, bytes]) -> Verdict:
        if current.content_id not in self._scores:
            self._scores[current.content_id] = await self._answer_all(current.runtime_load_id)
        before = self._scores[current.content_id]
        load_id = await self.runtime.load(candidate_id, files)
        try:
            after = await self._answer_all(load_id)
        finally:
            await self.runtime.unload(load_id)
        self._scores[candidate_id] = after
        return paired_verdict(before, after, self.config.margin, self.config.confidence)

    async def _answer_all(self, load_id: str | None) -> list[float]:
        assert self.scorer is not None
        release = ReleaseRef("gate", "gate", load_id)

        async def one(index: int, task: dict[str, Any]) -> float:
            request = ChatRequest(model="gate", messages=_messages(task), dialect="openai", stream=False,
                                  max_tokens=self.config.max_tokens, temperature=self.config.temperature, seed=index)
            result = ChatResult()
            async for delta in self.runtime.generate(request, release):
                result.add(delta)
            return float(self.scorer(task, result.text))  # type: ignore[misc]

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(self.tasks))))

    # -- offline check ------------------------------------------------------------------------------

    async def _offline(self, current_files: Mapping[str, bytes], candidate_files: Mapping[str, bytes],
                       holdout: Sequence[tuple[float, Sample]]) -> Verdict:
        if not holdout:
            return Verdict("reject", {"gate": "offline", "reason": "no held-out reported records yet"})
        mean_score = sum(score for score, _ in holdout) / len(holdout)
        good = [s for score, s in holdout if score > mean_score]
        bad = [s for score, s in holdout if score < mean_score]
        if len(good) < MIN_HOLDOUT_EACH or len(bad) < MIN_HOLDOUT_EACH:
            return Verdict("reject", {"gate": "offline", "reason": f"need {MIN_HOLDOUT_EACH} well- and badly-scored "
                                      f"held-out records, have {len(good)} and {len(bad)}"})
        good_drift = await self._drift(current_files, candidate_files, good)
        bad_drift = await self._drift(current_files, candidate_files, bad)
        bound = self.config.offline_bound
        ok = good_drift >= -bound and bad_drift <= bound
        metrics = {"gate": "offline", "good_drift": good_drift, "bad_drift": bad_drift, "bound": bound,
                   "good": len(good), "bad": len(bad)}
        return Verdict("select" if ok else "reject", metrics)

    async def _drift(self, current: Mapping[str, bytes], candidate: Mapping[str, bytes], samples: list[Sample]) -> float:
        """Mean over samples of the change in mean log-prob per token, candidate minus current."""
        sequences = [(s.prompt_ids, s.completion_ids) for s in samples]
        before = await self.worker.logprobs(dict(current) or None, sequences)
        after = await self.worker.logprobs(dict(candidate), sequences)
        per_sample = [_mean(a) - _mean(b) for a, b in zip(after, before)]
        return _mean(per_sample)


def paired_verdict(before: list[float], after: list[float], margin: float, confidence: float) -> Verdict:
    """Select when the mean gain reaches `margin` and the sign test says wins beat losses."""
    diffs = [a - b for a, b in zip(after, before)]
    wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    p_value = sign_test_p(wins, losses)
    gain = _mean(diffs)
    ok = wins > losses and gain >= margin and p_value <= 1 - confidence
    metrics = {
        "gate": "tasks", "n": len(diffs), "wins": wins, "losses": losses, "ties": len(diffs) - wins - losses,
        "current_score": _mean(before), "candidate_score": _mean(after), "gain": gain, "p_value": p_value,
        "p_worse": sign_test_p(losses, wins),  # the same test the other way: is the candidate worse?
        "margin": margin, "confidence": confidence,
        "current_success": _mean([float(b >= 1.0) for b in before]),
        "candidate_success": _mean([float(a >= 1.0) for a in after]),
        "per_task": [{"current": b, "candidate": a} for b, a in zip(before, after)],
    }
    return Verdict("select" if ok else "reject", metrics)


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided: the chance of at least `wins` wins in `wins + losses` fair coin flips."""
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


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
