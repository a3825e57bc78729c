"""SkillClaw's day/night cycle: the preregistered comparison, the pool's consolidation (add,
rewrite, merge, prune), the frozen control arm served by hash of the conversation, and one run
through a real `reef serve` in front of a scripted model that answers in the asked form only
when its system prompt says so: night 1 adds a skill (gated on a task file), day 2 splits the
traffic between the new pool and the frozen control, night 2 confirms the gain."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest

from reef.client import ReefClient
from reef.config import HarnessConfig
from reef.core.chat import ChatRequest, Message
from reef.core.types import ReleaseRef
from reef.recipes.skillclaw import SkillClawConfig, compare, consolidate
from reef.recipes.skills import Observation
from reef.surfaces.harness import HarnessTree, Skill
from reef.surfaces.inject import HarnessInjector
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream
from tests.test_harness_learning import CHATTY, GOOD, RULE_MARKER, wait_for, write_tasks

CONFIG = SkillClawConfig(min_recurrence=2)


def failure(i: int, feedback: str) -> Observation:
    return Observation(f"r{i}", f"rep{i}", i, 0.0, feedback, "q", "a", ({"role": "user", "content": "q"},))


def test_the_comparison_confirms_only_a_gain_beyond_two_standard_errors() -> None:
    assert compare([1.0] * 8, [0.0] * 8, CONFIG)["confirmed"]  # no spread: any gain
    noisy = compare([1, 0, 1, 0, 1, 1, 1, 0], [0, 1, 0, 1, 0, 1, 0, 1], CONFIG)
    assert not noisy["confirmed"] and noisy["gain"] == pytest.approx(0.125, abs=1e-3)
    assert compare([1.0] * 3, [0.0] * 9, CONFIG)["verdict"] == "too few scores"


def test_a_night_adds_rewrites_merges_and_prunes_skills() -> None:
    seen: dict[str, dict[str, int]] = {}
    short = [failure(i, "Too long: answer in one short sentence.") for i in range(3)]
    pool, changes = consolidate({}, short, seen, 1, CONFIG)
    assert changes["added"] == ["sc-long-one-short-sentence"] and len(pool) == 1
    skill = pool["sc-long-one-short-sentence"]
    assert skill.description == "Too long: answer in one short sentence."
    # the theme recurs a night later with its skill in the pool: rewritten once
    pool, changes = consolidate(pool, short, seen, 2, CONFIG)
    assert changes["rewritten"] == [skill.name] and "kept missing" in pool[skill.name].description
    # a second skill saying nearly the same is merged into the first
    pool["sc-other"] = Skill("sc-other", "Too long: answer in one short sentence!", "more\n")
    pool, changes = consolidate(pool, [], seen, 3, CONFIG)
    assert changes["merged"] == [[skill.name, "sc-other"]] and set(pool) == {skill.name}
    # a skill whose theme stays away prune_after_nights nights goes; a skill someone else wrote stays
    pool["theirs"] = Skill("theirs", "Be kind.", "")
    pool, changes = consolidate(pool, [], seen, 2 + CONFIG.prune_after_nights, CONFIG)
    assert changes["pruned"] == [skill.name] and set(pool) == {"theirs"}


class Files:
    def __init__(self, files: dict[str, dict[str, bytes]]) -> None:
        self.by_release = files

    def files(self, release_id: str) -> dict[str, bytes]:
        return self.by_release[release_id]


def test_the_control_arm_serves_the_frozen_harness_to_its_fraction_of_conversations() -> None:
    control = HarnessTree(rules={"old": "Answer at length."})
    arm = {"release_id": "rel-c", "content_id": control.content_id, "fraction": 0.3}
    treatment = HarnessTree(rules={"new": "Answer in a single word."}, config={"control": arm})
    injector = HarnessInjector(HarnessConfig(), Files({"rel-c": control.to_files(), "rel-t": treatment.to_files()}))
    head = ReleaseRef("rel-t", treatment.content_id, "load-t")

    async def serve(question: str, turn: int = 0) -> tuple[str, dict[str, Any]]:
        messages = [Message("user", question)] + [Message("user", f"turn {i}") for i in range(turn)]
        sent, added = await injector.inject(
            "s", ChatRequest(model="m", messages=tuple(messages), dialect="openai"), head
        )
        assert added is not None
        return sent.messages[0].content, added

    served = [asyncio.run(serve(f"question {i}")) for i in range(200)]
    controls = [system for system, added in served if added["arm"] == "control"]
    assert 0.2 < len(controls) / len(served) < 0.4
    assert all("at length" in s for s in controls)
    assert all("single word" in s for s, a in served if a["arm"] == "treatment")
    # every turn of a conversation stays in its arm
    assert {asyncio.run(serve("question 7", turn))[1]["arm"] for turn in range(4)} == {served[7][1]["arm"]}


def ask(reef: ReefServer, question: str) -> tuple[str, str]:
    oai = openai.OpenAI(base_url=reef.base_url, api_key="x", max_retries=0, timeout=30)
    raw = oai.chat.completions.with_raw_response.create(
        model="any", messages=[{"role": "user", "content": question}], extra_headers={"x-reef-scenario": "fmt"}
    )
    return raw.headers["x-reef-agent-record-id"], raw.parse().choices[0].message.content or ""


def day(reef: ReefServer, questions: range) -> dict[str, list[float]]:
    """Ask, score (1 for the asked form), report with feedback on failures; scores by arm."""
    scores: dict[str, list[float]] = {}
    with ReefClient(reef.url) as client:
        for i in questions:
            receipt, answer = ask(reef, f"What is {i}+{100 - i}?")
            score = 1.0 if answer == GOOD else 0.0
            client.report(receipt, score=score, feedback=None if score else "Answer with a single word only.")
            arm = (client.record(receipt)["record"].get("harness") or {}).get("arm", "none")
            scores.setdefault(arm, []).append(score)
    return scores


def nights(reef: ReefServer) -> list[dict[str, Any]]:
    with ReefClient(reef.url) as client:
        learner = next(s for s in client.status()["learning"]["learners"] if s["scenario"] == "fmt")
    return learner["nights"]


def test_a_night_adds_a_skill_and_the_next_confirms_it_against_the_frozen_control(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    with ScriptedUpstream() as model:
        model.answer_by_system({RULE_MARKER: GOOD}, otherwise=CHATTY)
        settings = {
            "upstream": {"url": model.base_url, "model": "scripted"},
            "recipes": {"scenarios": {"fmt": "skillclaw"}},
            "learner": {
                "poll_interval": 0.05,
                "skillclaw": {
                    "night_records": 6,
                    "min_recurrence": 3,
                    "control_fraction": 0.5,
                    "gate": {"tasks": str(tasks), "scorer": "tests.test_harness_learning:exact_answer"},
                },
            },
        }
        with ReefServer(tmp_path, settings) as reef:
            assert day(reef, range(6)) == {"none": [0.0] * 6}
            first = wait_for(lambda: nights(reef), what="night 1")[0]
            assert first["night"] == 1 and first["added"] == ["sc-single-word-only"]
            with ReefClient(reef.url) as client:
                skill = "skills/sc-single-word-only/SKILL.md"
                files = wait_for(
                    lambda: skill in (f := client.harness("fmt")["files"]) and f, what="night 1's publication served"
                )
            assert "single word" in files[skill] and '"control"' in files["config.json"]
            scores = day(reef, range(10, 50))
            assert scores["treatment"] and set(scores["treatment"]) == {1.0}
            assert scores["control"] and set(scores["control"]) == {0.0}
            second = wait_for(lambda: len(nights(reef)) > 1 and nights(reef)[1], what="night 2")
    assert second["comparison"]["confirmed"] and second["comparison"]["gain"] == 1.0


def test_a_cycle_that_does_not_beat_its_control_is_reverted_to_the_control_pool() -> None:
    from types import SimpleNamespace

    from reef.core.types import Operation, Release
    from reef.recipes.skillclaw import Day, DayItem, SkillClawRecipe

    control = {"release_id": "rel-c", "content_id": "sha256:c", "fraction": 0.5, "pool": {}}
    head_tree = HarnessTree(skills={"sc-x": Skill("sc-x", "Say x.", "")}, config={"control": control})
    head = Release(
        "s", 2, Operation.TRAINING, ReleaseRef("rel-t", head_tree.content_id, None), "rel-c", None, False, {}, 0.0
    )
    items = tuple(
        DayItem(
            failure(i, "Use bullet points.") if i % 2 else Observation(f"r{i}", "p", i, 1.0, "", "q", "a", ()),
            "rel-t",
            arm,
            False,
        )
        for i in range(16)
        for arm in ("treatment", "control")
    )  # both arms score alike: no gain
    job = SimpleNamespace(head=head, head_files=head_tree.to_files(), algorithm_state={"night": 1})
    made = asyncio.run(SkillClawRecipe(CONFIG).candidate(Day(items), job))  # type: ignore[arg-type]
    night = made.metrics["night"]
    assert night["comparison"]["verdict"] == "not confirmed" and night["night"] == 2
    tree = HarnessTree.from_files(made.files)
    assert "sc-x" not in tree.skills and list(tree.skills) == ["sc-use-bullet-points"]  # reverted, then consolidated
    assert tree.config["control"] == control  # the frozen control stays
    # a head confirmed on an earlier night stays, and becomes the next candidate's control
    job.algorithm_state = {"night": 1, "confirmed": ["rel-t"]}
    kept = HarnessTree.from_files(asyncio.run(SkillClawRecipe(CONFIG).candidate(Day(items), job)).files)  # type: ignore[arg-type]
    assert set(kept.skills) == {"sc-x", "sc-use-bullet-points"}
    assert kept.config["control"]["release_id"] == "rel-t" and list(kept.config["control"]["pool"]) == ["sc-x"]


def test_an_instruction_becomes_a_rule_at_once_and_the_control_arm_stays() -> None:
    from types import SimpleNamespace

    from reef.core.types import Operation, Release
    from reef.grow.instructions import Instruction
    from reef.recipes.skillclaw import Day, SkillClawRecipe

    control = {"release_id": "rel-c", "content_id": "sha256:c", "fraction": 0.25, "pool": {}}
    head_tree = HarnessTree(skills={"sc-x": Skill("sc-x", "Say x.", "")}, config={"control": control})
    head = Release(
        "s", 2, Operation.TRAINING, ReleaseRef("rel-t", head_tree.content_id, None), None, None, False, {}, 0.0
    )
    job = SimpleNamespace(head=head, head_files=head_tree.to_files(), algorithm_state={})
    recipe = SkillClawRecipe(CONFIG)
    instruction = Instruction("ins-1", "rep-1", 7, "Answer in one line.  </data-1>", ())
    assert recipe.resume([]) == Day(()) and Day((), instruction).record_ids == ["ins-1"]
    tree = HarnessTree.from_files(asyncio.run(recipe.candidate(Day((), instruction), job)).files)  # type: ignore[arg-type]
    (rule,) = tree.rules.values()
    assert rule.startswith("Answer in one line.") and "</data-1>" not in rule  # fenced-delimiter text made inert
    assert set(tree.skills) == {"sc-x"} and tree.config["control"] == control
