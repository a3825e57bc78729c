"""The harness gate: a candidate harness is published only if it wins on the same tasks.

Candidate and current tree answer the same evaluation tasks (the JSONL file `gate.tasks`, or
else the held-out reported prompts) through the scenario's runtime, on the load that serves
it now: only the harness differs, put in front of each task's system prompt as inject mode
does. A configured scorer (`module:function(task, text) -> float`, loaded as the weights gate
loads it) or a judge model scores each answer. Per task the higher score wins; the candidate
is selected only when wins minus losses reaches `margin` (ties count for neither). The verdict
carries every task's scores and answer excerpts into the release chain.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Sequence

from reef.commit.gate import Scorer, _messages, load_scorer, load_tasks
from reef.config import HarnessGateConfig, ModelEndpointConfig
from reef.core.chat import ChatRequest, ChatResult, Message
from reef.core.errors import InvalidInput, RuntimeFailure
from reef.core.fence import Fence
from reef.core.types import ReleaseRef, Verdict
from reef.runtimes.base import Runtime, loads_trained_weights
from reef.runtimes.endpoint import ModelEndpoint
from reef.surfaces.harness import HarnessTree, render_system
from reef.surfaces.inject import request_text, with_system_prefix

EXCERPT = 160
CONCURRENCY = 8
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

JUDGE_INSTRUCTIONS = """You grade one answer of an AI assistant to a task, from 0 (useless or wrong)
to 1 (fully correct and in the asked form). {fence_rule}
Reply with the number only."""


class HarnessGate:
    def __init__(self, config: HarnessGateConfig, runtime: Runtime) -> None:
        self.config = config
        self.runtime = runtime
        self.tasks = load_tasks(config.tasks) if config.tasks else []
        self.scorer: Scorer | None = load_scorer(config.scorer) if config.scorer else None
        judge = config.judge
        if judge is None and not loads_trained_weights(runtime):
            judge = ModelEndpointConfig()  # a hosted model judges with itself, so harness learning needs no setting
        self.judge = ModelEndpoint(judge, runtime) if judge and not self.scorer else None
        if self.scorer is None and self.judge is None:
            raise InvalidInput(
                f"the harness gate needs a scorer (module:function) or a judge model on the {runtime.name} "
                "runtime (learner.skills.gate.scorer or .judge)"
            )
        self._cache: dict[tuple[str, str], list[tuple[float, str]]] = {}  # fixed tasks only

    async def judge_candidate(
        self,
        serving: ReleaseRef,
        current: HarnessTree,
        candidate: HarnessTree,
        held_out: Sequence[dict[str, Any]],
        margin: int | None = None,
    ) -> Verdict:
        """`margin`: the wins minus losses to reach, when an operator changed it live (else the config's)."""
        tasks, source = (self.tasks, "file") if self.tasks else (list(held_out), "held_out")
        if not tasks:
            return Verdict(
                "reject",
                {
                    "gate": "harness",
                    "reason": "no evaluation tasks yet (no gate.tasks file and no held-out reported records)",
                },
            )
        before = await self._answers(serving, current, tasks, cache=source == "file")
        after = await self._answers(serving, candidate, tasks, cache=source == "file")
        return harness_verdict(tasks, before, after, self.config.margin if margin is None else margin, source)

    async def _answers(
        self, serving: ReleaseRef, tree: HarnessTree, tasks: list[dict[str, Any]], cache: bool
    ) -> list[tuple[float, str]]:
        key = (serving.content_id, tree.content_id)
        if cache and key in self._cache:
            return self._cache[key]
        limit = asyncio.Semaphore(CONCURRENCY)

        async def one(index: int, task: dict[str, Any]) -> tuple[float, str]:
            async with limit:
                text = await self._answer(serving, tree, task, index)
                return await self._score(task, text, serving), text

        answers = list(await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks))))
        if cache:
            self._cache[key] = answers
        return answers

    async def _answer(self, serving: ReleaseRef, tree: HarnessTree, task: dict[str, Any], seed: int) -> str:
        request = ChatRequest(
            model="reef-gate",
            messages=_messages(task),
            dialect="openai",
            stream=False,
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
            seed=seed,
        )
        if not tree.is_empty:
            request, _ = with_system_prefix(request, render_system(tree, request_text(request)))
        result = ChatResult()
        try:
            async for delta in self.runtime.generate(request, serving):
                result.add(delta)
        except RuntimeFailure as exc:  # an answer that failed scores as a failure, for both sides alike
            return f"[runtime failure: {exc}]"
        return result.text

    async def _score(self, task: dict[str, Any], text: str, serving: ReleaseRef) -> float:
        if self.scorer is not None:
            return float(self.scorer(task, text))
        assert self.judge is not None
        fence = Fence()
        task_text = "\n".join(f"[{m.role}] {m.content}" for m in _messages(task))
        # a held-out record's report says what its user wanted of an answer: the judge reads it too
        feedback = (
            fence.block("user feedback on an earlier answer", task["feedback"]) + "\n" if task.get("feedback") else ""
        )
        messages = [
            Message("system", JUDGE_INSTRUCTIONS.format(fence_rule=fence.rule())),
            Message(
                "user",
                f"{fence.block('task', task_text)}\n{feedback}{fence.block('answer', text)}\n"
                "Grade the answer: one number from 0 to 1.",
            ),
        ]
        try:
            graded = await self.judge.ask(messages, serving)
        except RuntimeFailure:
            return 0.0
        number = _NUMBER.search(graded)
        return min(1.0, max(0.0, float(number.group()))) if number else 0.0

    async def close(self) -> None:
        if self.judge is not None:
            await self.judge.close()


def harness_verdict(
    tasks: Sequence[dict[str, Any]],
    before: Sequence[tuple[float, str]],
    after: Sequence[tuple[float, str]],
    margin: int,
    source: str,
) -> Verdict:
    per_task = []
    wins = losses = 0
    for task, (b, b_text), (a, a_text) in zip(tasks, before, after):
        wins, losses = wins + (a > b), losses + (a < b)
        per_task.append(
            {
                "task": _excerpt(_task_text(task)),
                "current": b,
                "candidate": a,
                "current_answer": _excerpt(b_text),
                "candidate_answer": _excerpt(a_text),
            }
        )
    n = len(per_task)
    metrics = {
        "gate": "harness",
        "tasks": source,
        "n": n,
        "wins": wins,
        "losses": losses,
        "ties": n - wins - losses,
        "margin": margin,
        "current_score": _mean([b for b, _ in before]),
        "candidate_score": _mean([a for a, _ in after]),
        "current_success": _mean([float(b >= 1.0) for b, _ in before]),
        "candidate_success": _mean([float(a >= 1.0) for a, _ in after]),
        "per_task": per_task,
    }
    return Verdict("select" if wins - losses >= margin else "reject", metrics)


def _task_text(task: dict[str, Any]) -> str:
    return " | ".join(m.content for m in _messages(task) if m.role != "system")


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT else text[:EXCERPT] + "…"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
