"""The harness gate without a server: each tree is rendered in front of the task's system
prompt, the scorer or a judge model scores, wins minus losses decides."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator, Mapping

import pytest

from reef.commit.harness_gate import HarnessGate, harness_verdict
from reef.config import HarnessGateConfig, ModelEndpointConfig
from reef.core.chat import ChatRequest, Delta, Finish, TextDelta
from reef.core.errors import InvalidInput
from reef.core.types import ReleaseRef
from reef.runtimes.base import Runtime
from reef.surfaces.harness import HarnessTree

SERVING = ReleaseRef("r", "c", "load-1")


class RuleFollower(Runtime):
    """Answers "4" when the system prompt holds the word "brief", else rambles; a judge prompt
    (it names "Grade") gets a grade: 1 for a short answer, else 0."""

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []

    def served_models(self) -> list[str]:
        return ["rule-follower"]

    async def generate(self, request: ChatRequest, release: ReleaseRef) -> AsyncIterator[Delta]:
        self.requests.append(request)
        system = "".join(m.content for m in request.messages if m.role == "system")
        last = request.messages[-1].content
        if "Grade the answer" in last:
            text = "Grade: 1" if 'label="answer">\n4\n' in last else "0.0"
        else:
            text = "4" if "brief" in system else "Well, let me think about it: 4."
        yield TextDelta(text)
        yield Finish("stop")

    async def count_tokens(self, request: ChatRequest) -> int:
        return 0

    async def load(self, content_id: str, files: Mapping[str, bytes]) -> str:
        return "load"

    async def unload(self, runtime_load_id: str) -> None:
        return None


def exact_four(task: dict, text: str) -> float:
    return 1.0 if text.strip() == "4" else 0.0


def tasks_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        '{"prompt": "2+2?"}\n{"messages": [{"role": "system", "content": "You are a calculator."}, '
        '{"role": "user", "content": "3+1?"}]}\n'
    )
    return path


def test_the_candidate_is_rendered_before_the_task_system_prompt_and_wins(tmp_path: Path) -> None:
    runtime = RuleFollower()
    gate = HarnessGate(
        HarnessGateConfig(tasks=tasks_file(tmp_path), scorer="tests.test_harness_gate:exact_four"), runtime
    )
    brief = HarnessTree(rules={"brevity": "Be brief."})
    verdict = asyncio.run(gate.judge_candidate(SERVING, HarnessTree(), brief, []))
    assert verdict.decision == "select" and (verdict.metrics["wins"], verdict.metrics["losses"]) == (2, 0)
    assert verdict.metrics["per_task"][1]["candidate_answer"] == "4"
    system = runtime.requests[-1].messages[0]
    assert (
        system.role == "system" and system.content.endswith("You are a calculator.") and "Be brief." in system.content
    )
    calls = len(runtime.requests)
    back = asyncio.run(gate.judge_candidate(SERVING, brief, HarnessTree(), []))  # the worse tree loses
    assert back.decision == "reject" and back.metrics["losses"] == 2
    assert len(runtime.requests) == calls  # both trees' answers on the fixed tasks were kept


def test_a_judge_model_scores_when_no_scorer_is_set_and_held_out_records_are_the_tasks() -> None:
    runtime = RuleFollower()
    gate = HarnessGate(HarnessGateConfig(judge=ModelEndpointConfig()), runtime)  # the scenario's own runtime judges
    held_out = [{"messages": [{"role": "user", "content": f"{i}+1?"}], "feedback": "too long"} for i in range(3)]
    verdict = asyncio.run(gate.judge_candidate(SERVING, HarnessTree(), HarnessTree(system="Be brief."), held_out))
    assert verdict.decision == "select" and verdict.metrics["tasks"] == "held_out" and verdict.metrics["wins"] == 3
    assert asyncio.run(gate.judge_candidate(SERVING, HarnessTree(), HarnessTree(system="x"), [])).decision == "reject"


def test_margin_and_configuration_errors() -> None:
    tasks = [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}]
    before, after = [(0.0, ""), (1.0, ""), (0.5, "")], [(1.0, ""), (0.0, ""), (1.0, "")]
    assert harness_verdict(tasks, before, after, margin=1, source="file").decision == "select"  # 2 wins, 1 loss
    assert harness_verdict(tasks, before, after, margin=2, source="file").decision == "reject"
    assert HarnessGate(HarnessGateConfig(), RuleFollower()).judge is not None  # a hosted model judges itself
    loads_weights = RuleFollower()
    loads_weights.model_dir = Path("model")  # type: ignore[attr-defined]  # a runtime Reef trains: no default judge
    with pytest.raises(InvalidInput, match="scorer .* or a judge"):
        HarnessGate(HarnessGateConfig(), loads_weights)
