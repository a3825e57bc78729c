"""SkillClaw: a skill pool that evolves in a day/night cycle, checked against a frozen control.

By day the scenario serves and collects reports. Each release this recipe publishes names a
frozen control arm in its harness config (`reef.surfaces.inject.control_arm`): the harness the
cycle started from, which serves `control_fraction` of conversations (chosen by a hash of the
first user message) while the rest get the new pool; each record says which arm served it.

Night comes after `night_records` reports of the day's head (or `night_every_s`, when set, with
at least `MIN_ARM_SCORES` on each arm). Then, in order:
1. The preregistered comparison: the day's mean score of the new pool (treatment) minus the
   control's, against two standard errors of that difference. Above it, the cycle is confirmed:
   its pool stays and becomes the next candidate's control. A cycle not (yet) confirmed is
   reverted: the next pool starts again from the control's (kept in the control arm's entry).
2. Consolidation of the pool from the day's failures (feedback grouped into themes, as the
   model-free `distill` proposer groups them): a theme recurring `min_recurrence` times with no
   skill for it adds one (`sc-<words>`), whose description (shown in every prompt) is the
   theme's central feedback; a theme that still recurs with its skill in the pool rewrites it
   once; skills whose descriptions overlap by half their words are merged; a skill whose theme has not
   recurred for `prune_after_nights` nights is pruned. The pool grows and shrinks.
3. One candidate (the consolidated pool with the next control arm) goes to the harness gate like
   any other; a night that changes nothing is abandoned and the day goes on.

The pool's history (per night: the comparison, what was added, merged, rewritten, pruned) is in
the line's algorithm state, so it survives restarts; `status()` shows the last nights.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from statistics import fmean, pvariance
from typing import Any, Iterable, Sequence

from pydantic import Field

from reef.config import HarnessGateConfig
from reef.config.strict import Strict
from reef.core.types import JSON, Record, RecordStatus, ReportedRecords
from reef.grow.instructions import Instruction, instruction_in
from reef.grow.recipe import Abandon, Job, LearnerView, Made, RecipeContext, held_out, missing_records
from reef.recipes.instruction_rule import instruction_rule
from reef.recipes.proposers.distill import Theme, central_feedback, jaccard, normalise, rule_name, themes
from reef.recipes.skills import HOLDOUT_SALT, MAX_HOLDOUT, Observation, feedback_text, observation_of
from reef.surfaces.harness import HarnessTree, Skill, merge_files
from reef.surfaces.inject import CONTROL_KEY

NAME = "skillclaw"
SKILL_PREFIX = "sc-"
KEEP_NIGHTS = 30  # nights of history kept in the algorithm state
MAX_DESCRIPTION = 400
MIN_ARM_SCORES = 8  # reports of each arm before the comparison may decide
GAIN_SD = 2.0  # the preregistered criterion: the gain over control beyond two standard errors
FAILURE_BELOW = 0.5  # a reported score below this is a failure
SIMILARITY = 0.5  # word overlap (Jaccard) of one feedback theme, or of two skills merged
MAX_SKILLS = 16  # the largest pool; the skills unseen longest go first


class SkillClawConfig(Strict):
    """Knobs of the `skillclaw` recipe: `learner.skillclaw` (docs/harness.md explains the cycle)."""

    night_records: int = Field(48, ge=2, description="Reports on the day's head that bring the night")
    night_every_s: float | None = Field(None, gt=0, description="Also bring the night after this many seconds")
    control_fraction: float = Field(0.25, gt=0, lt=1, description="Conversations served by the frozen control arm")
    min_recurrence: int = Field(3, ge=1, description="Failures with similar feedback before a skill")
    prune_after_nights: int = Field(3, ge=1, description="Nights without its theme before a skill is pruned")
    gate: HarnessGateConfig = Field(default_factory=HarnessGateConfig)


@dataclass(frozen=True)
class DayItem:
    observation: Observation
    release_id: str | None
    arm: str | None  # "treatment" / "control" / None (served before the pool named a control)
    held: bool  # a held-out gate task: compared, never consolidated from


@dataclass(frozen=True)
class Day:
    items: tuple[DayItem, ...]
    instruction: Instruction | None = None  # an operator's instruction: a batch of its own, by day

    @property
    def record_ids(self) -> list[str]:
        own = [self.instruction.id] if self.instruction else []
        return own + [i.observation.record_id for i in self.items]

    @property
    def report_ids(self) -> list[str]:
        own = {self.instruction.report_id} if self.instruction else set()
        return sorted(own | {i.observation.report_id for i in self.items})


class SkillClawRecipe:
    name = NAME
    surface = "harness"
    Settings = SkillClawConfig

    def __init__(self, config: SkillClawConfig, context: RecipeContext | None = None) -> None:
        self.config = config
        self.day: list[DayItem] = []
        self.day_started = time.monotonic()
        self.clock = time.monotonic
        self.nights: list[JSON] = []
        self.instructions: list[Instruction] = []
        self.held_out: deque[Observation] = deque(maxlen=MAX_HOLDOUT)
        # held-out records serve the gate only when it has no task file
        self.holdout_fraction = 0.0 if config.gate.tasks else config.gate.holdout_fraction

    @property
    def harness_gate(self) -> HarnessGateConfig:
        return self.config.gate

    # -- day ------------------------------------------------------------------------------------

    def intake(self, items: Sequence[ReportedRecords], view: LearnerView) -> None:
        for item in items:
            if missing_records(item):
                view.drop("compacted_or_missing", missing_records(item))
            if (instruction := instruction_in(item)) is not None:
                self.instruct(instruction, view)
                continue
            feedback = feedback_text(item.report.feedback)
            for record in item.records:
                if record.id in view.consumed:
                    view.drop("already_used")
                elif record.status is not RecordStatus.COMPLETE:
                    view.drop("not_complete")
                else:
                    view.consumed.add(record.id)
                    self.day.append(day_item(record, item, feedback, self.holdout_fraction))
                    if self.day[-1].held:
                        self.held_out.append(self.day[-1].observation)

    def instruct(self, instruction: Instruction, view: LearnerView) -> None:
        """An operator's instruction becomes a rule at once (a candidate of its own, gated like any
        other), not waiting for the night; the pool and the control arm stay as they are."""
        if instruction.id in view.consumed:
            view.drop("already_used")
            return
        view.consumed.add(instruction.id)
        self.instructions.append(instruction)

    async def next_batch(self, view: LearnerView) -> Day | None:
        if self.instructions:
            return Day((), self.instructions.pop(0))
        if not view.from_traffic:  # the training mode holds the night until an operator asks
            return None
        head = view.head().release_id
        on_head = [i for i in self.day if i.release_id == head]
        if any(i.arm for i in on_head) and not all(
            len(arm_scores(on_head, a)) >= MIN_ARM_SCORES for a in ("treatment", "control")
        ):
            return None  # the comparison waits for enough of each arm
        by_count = len(on_head) >= self.config.night_records
        by_clock = (
            self.config.night_every_s is not None and self.clock() - self.day_started >= self.config.night_every_s
        )
        if not (by_count or (by_clock and on_head)):
            return None
        day, self.day, self.day_started = Day(tuple(self.day)), [], self.clock()
        return day

    def resume(self, items: Sequence[ReportedRecords]) -> Day:
        if items and (instruction := instruction_in(items[0])) is not None:
            return Day((), instruction)
        return Day(
            tuple(day_item(i.records[0], i, feedback_text(i.report.feedback), self.holdout_fraction) for i in items)
        )

    def high_water(self, cursor: int) -> int:
        seqs = [i.observation.report_seq for i in self.day] + [i.report_seq for i in self.instructions]
        return min(seqs) - 1 if seqs else cursor

    # -- night ----------------------------------------------------------------------------------

    async def candidate(self, batch: Day, job: Job) -> Made:
        if batch.instruction is not None:
            head = HarnessTree.from_files(job.head_files)
            rule = instruction_rule(head, batch.instruction)
            return Made(
                merge_files(job.head_files, head.apply([rule])),
                metadata={"instruction_id": batch.instruction.id},
                metrics={"proposal": {"proposer": "instruction", "mutations": [rule.to_json()]}},
                held_out=[o.as_task() for o in self.held_out],
            )
        c = self.config
        state = job.algorithm_state
        night = int(state.get("night", 0)) + 1
        head = HarnessTree.from_files(job.head_files)
        on_head = [i for i in batch.items if i.release_id == job.head.release_id]
        comparison = compare(arm_scores(on_head, "treatment"), arm_scores(on_head, "control"), c)
        control = head.config.get(CONTROL_KEY)
        confirmed = [*(state.get("confirmed") or [])]  # heads confirmed on an earlier night stay
        if comparison["confirmed"] and job.head.release_id not in confirmed:
            confirmed = [*confirmed, job.head.release_id][-KEEP_NIGHTS:]
        keep = control is None or job.head.release_id in confirmed
        if keep:
            start_pool, arm = dict(head.skills), arm_of(job.head, head.skills, c.control_fraction)
        else:  # the cycle did not beat its control: start again from the control's pool
            start_pool, arm = pool_from_json(control.get("pool") or {}), control
        seen: dict[str, dict[str, int]] = {k: dict(v) for k, v in (state.get("skills") or {}).items()}
        failures = [  # the control arm's failures are the old pool's: not this cycle's to fix
            i.observation
            for i in batch.items
            if not i.held and i.arm != "control" and i.observation.score < FAILURE_BELOW
        ]
        pool, changes = consolidate(start_pool, failures, seen, night, c)
        summary = {"night": night, "comparison": comparison, "pool": len(pool), "records": len(batch.items), **changes}
        nights = [*(state.get("nights") or []), summary][-KEEP_NIGHTS:]
        state.update(night=night, skills=seen, nights=nights, confirmed=confirmed)
        self.nights = nights
        tree = HarnessTree(head.system, head.rules, pool, {**head.config, CONTROL_KEY: arm}, head.extensions)
        if pool_json(pool) == pool_json(head.skills) and (keep or tree.content_id == head.content_id):
            raise Abandon("no_change", f"night {night}: the pool stays as it is ({comparison['verdict']})")
        return Made(
            merge_files(job.head_files, tree),
            metadata={"night": night},
            metrics={"night": summary},
            held_out=[o.as_task() for o in self.held_out],
        )

    def status(self) -> JSON:
        return {
            "day_reports": len(self.day),
            "nights": self.nights[-5:],
            "waiting_instructions": len(self.instructions),
        }

    async def close(self) -> None:
        return None


def day_item(record: Record, item: ReportedRecords, feedback: str, holdout_fraction: float) -> DayItem:
    arm = (record.harness or {}).get("arm")
    release = record.release.release_id if record.release is not None else None
    held = held_out(record.id, holdout_fraction, HOLDOUT_SALT)
    return DayItem(observation_of(record, item, feedback), release, arm if isinstance(arm, str) else None, held)


def arm_scores(items: Iterable[DayItem], arm: str) -> list[float]:
    return [i.observation.score for i in items if i.arm == arm]


def compare(treatment: Sequence[float], control: Sequence[float], c: SkillClawConfig) -> JSON:
    """The preregistered comparison: gain of the treatment's mean over the control's, in standard
    errors of the difference; confirmed only above two with `MIN_ARM_SCORES` of each."""
    if len(treatment) < MIN_ARM_SCORES or len(control) < MIN_ARM_SCORES:
        return {"confirmed": False, "verdict": "too few scores", "treatment": len(treatment), "control": len(control)}
    gain = fmean(treatment) - fmean(control)
    se = math.sqrt(pvariance(treatment) / len(treatment) + pvariance(control) / len(control))
    confirmed = gain > GAIN_SD * se if se > 0 else gain > 0
    return {
        "confirmed": confirmed,
        "verdict": "confirmed" if confirmed else "not confirmed",
        "gain": round(gain, 4),
        "se": round(se, 4),
        "treatment": len(treatment),
        "control": len(control),
    }


def consolidate(
    pool: dict[str, Skill], failures: list[Observation], seen: dict[str, dict[str, int]], night: int, c: SkillClawConfig
) -> tuple[dict[str, Skill], JSON]:
    """The night's pool: add, rewrite, merge and prune (module docstring)."""
    pool = dict(pool)
    added, rewritten, merged, pruned = [], [], [], []
    for theme in themes(failures, SIMILARITY):
        if len(theme.members) < c.min_recurrence:
            continue
        name = skill_of_theme(pool, theme, SIMILARITY) or SKILL_PREFIX + rule_name(theme).removeprefix("fb-")
        seen.setdefault(name, {"born": night})["seen"] = night
        text = central_feedback(theme)[:MAX_DESCRIPTION]
        if name not in pool:
            pool[name] = Skill(name, text, f"Learned from {len(theme.members)} reports like: {text}\n")
            added.append(name)
        elif int(seen[name].get("rewritten", 0)) < 1 and int(seen[name].get("born", night)) < night:
            pool[name] = Skill(name, f"{text} Earlier answers kept missing this.", pool[name].body)
            seen[name]["rewritten"] = 1
            rewritten.append(name)
    for a, b in merge_pairs(pool, SIMILARITY):
        if a in pool and b in pool:
            pool[a] = Skill(a, pool[a].description, pool[a].body + pool[b].body)
            del pool[b]
            merged.append([a, b])
    own = [n for n in pool if n.startswith(SKILL_PREFIX)]  # skills someone else wrote are never pruned
    for name in sorted(own, key=lambda n: int(seen.get(n, {}).get("seen", 0))):
        last = int(seen.get(name, {}).get("seen", night))
        if night - last >= c.prune_after_nights or len(pool) > MAX_SKILLS:
            del pool[name]
            pruned.append(name)
    return pool, {"added": added, "rewritten": rewritten, "merged": merged, "pruned": pruned}


def skill_of_theme(pool: dict[str, Skill], theme: Theme, similarity: float) -> str | None:
    for name, skill in sorted(pool.items()):
        if name.startswith(SKILL_PREFIX) and jaccard(normalise(skill.description), theme.words) >= similarity:
            return name
    return None


def merge_pairs(pool: dict[str, Skill], similarity: float) -> list[tuple[str, str]]:
    names = sorted(n for n in pool if n.startswith(SKILL_PREFIX))
    words = {n: normalise(pool[n].description) for n in names}
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if jaccard(words[a], words[b]) >= similarity]


def arm_of(release: Any, pool: dict[str, Skill], fraction: float) -> JSON:
    """The control arm a candidate names: the release it starts from, with that release's pool
    (what a cycle that is not confirmed goes back to)."""
    return {
        "release_id": release.release_id,
        "content_id": release.content_id,
        "fraction": fraction,
        "pool": pool_json(pool),
    }


def pool_json(pool: dict[str, Skill]) -> JSON:
    return {n: [s.description, s.body] for n, s in sorted(pool.items())}


def pool_from_json(data: JSON) -> dict[str, Skill]:
    return {n: Skill(n, d, b) for n, (d, b) in data.items()}
