"""Learning by default in front of a hosted model: `reef serve` on the upstream runtime with no
recipe and no gate configured binds a new scenario to `skills`, the hosted model judges the
harness gate, and a rule learned from reported feedback reaches the prompt the provider receives.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import openai

from reef.client import ReefClient
from reef.config import RecipeConfig
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

RULE_MARKER = "single word"
GOOD, CHATTY = "4", "Sure! The answer is 4."
FEEDBACK = ["Answer with a single word only.", "Only a single word answer, please.", "Answer with a single word only!"]
_ANSWER_BLOCK = re.compile(r'label="answer">\n(.*?)\n</', re.S)


def _system(body: dict[str, Any]) -> str:
    return "\n".join(m["content"] for m in body["messages"] if m["role"] == "system")


def _is_judge(body: dict[str, Any]) -> bool:
    return _system(body).startswith("You grade one answer")


def hosted_model(body: dict[str, Any]) -> str:
    """A stand-in provider: as a judge it grades a one-word answer 1, anything else 0; as the
    served model it answers in one word only when its system prompt carries the rule."""
    system = _system(body)
    if _is_judge(body):
        answer = _ANSWER_BLOCK.search(body["messages"][-1]["content"])
        return "1" if answer and answer.group(1).strip() == GOOD else "0"
    return GOOD if RULE_MARKER in system else CHATTY


def served_system_prompts(upstream: ScriptedUpstream) -> list[str]:
    """The system prompt of each served request the provider received (the judge's left out)."""
    return [_system(r.body) for r in upstream.requests if not _is_judge(r.body)]


def test_no_recipe_configured_on_the_upstream_runtime_learns_the_harness(tmp_path: Path) -> None:
    with ScriptedUpstream() as upstream:
        upstream.answer_with(hosted_model)
        settings = {"upstream": {"url": upstream.base_url, "model": "hosted"}}
        with ReefServer(tmp_path, settings) as reef, ReefClient(reef.url) as client:
            oai = openai.OpenAI(base_url=reef.base_url, api_key="x", max_retries=0, timeout=30)
            deadline, sent, published = time.monotonic() + 60, 0, []
            while not published:
                assert time.monotonic() < deadline and sent < 200, (
                    f"nothing published after {sent} reports: {client.status()}"
                )
                raw = oai.chat.completions.with_raw_response.create(
                    model="any", messages=[{"role": "user", "content": "What is 2+2?"}]
                )
                assert raw.parse().choices[0].message.content == CHATTY
                client.report(raw.headers["x-reef-agent-record-id"], score=0.0, feedback=FEEDBACK[sent % 3])
                sent += 1
                published = [r for r in client.releases("default")["releases"] if r["operation"] == "training"]

            binding = next(b for b in client.status()["recipes"] if b["scenario"] == "default")
            assert binding == {
                "scenario": "default",
                "recipe": "skills",
                "surface": "harness",
                "why": "default for the upstream runtime, which cannot load trained weights",
            }
            assert published[0]["verdict"]["decision"] == "select"
            deadline = time.monotonic() + 10
            while (
                oai.chat.completions.create(model="any", messages=[{"role": "user", "content": "What is 2+2?"}])
                .choices[0]
                .message.content
                != GOOD
            ):  # served once the swap lands
                assert time.monotonic() < deadline, "the published harness never reached a request"
            assert "Answer with a single word" in served_system_prompts(upstream)[-1]
            assert RULE_MARKER not in served_system_prompts(upstream)[0]
            judged = [r.body["messages"][-1]["content"] for r in upstream.requests if _is_judge(r.body)]
            assert judged and all('label="user feedback on an earlier answer"' in text for text in judged)
        assert "a new scenario learns its harness (system prompt, rules, skills)" in reef.logs()


def test_an_explicit_recipe_wins_over_the_runtimes_default() -> None:
    assert RecipeConfig().choose("a", "upstream", False)[0] == "skills"
    assert RecipeConfig().choose("a", "embedded", True)[0] == "sao"
    assert RecipeConfig(default="sao").choose("a", "upstream", False) == ("sao", "recipes.default")
    assert RecipeConfig(default="sao", scenarios={"a": "skills"}).choose("a", "embedded", True) == (
        "skills",
        "recipes.scenarios.a",
    )
