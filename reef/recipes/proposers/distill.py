"""The model-free proposer: recurring feedback on failures becomes a rule.

Feedback is normalised (lower case, words only, common words dropped, a plural `s` cut) and
failures are grouped greedily: one joins the first theme whose first feedback shares at least
SIMILARITY of its words (Jaccard). A theme seen at least `min_recurrence` times is ready: its
most central feedback (the one most similar to the others), as written, becomes the rule
`fb-<its words>`. If a rule this proposer made for the same theme exists already (its text
shares the theme's words) and the theme still recurs, the rule did not stop it, and it is
updated once to say so; after that the theme waits. The gate decides whether a change helps.
No rule is retired here: a rule that stops helping is for the gate and rollback to judge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from reef.recipes.skills import Batch, Observation, Proposal, ProposalFailed, SkillsConfig
from reef.surfaces.harness import HarnessTree, Mutation

RULE_PREFIX = "fb-"
NAME_WORDS = 5
MAX_RULE_CHARS = 600
SIMILARITY = 0.5  # word overlap (Jaccard) of one theme
STILL_MISSED = "Earlier answers kept missing this rule; follow it exactly."
_WORD = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    """
a an the and or but if then so of to in on at by for with from as is are was were be been being it its this
that these those there here i you he she we they me my your our their them us do does did done not no yes
please should would could can will just very too also only than into about over after before again more
most some any such own same answer answers response reply output""".split()
) - {"not", "no", "only"}


@dataclass
class Theme:
    words: frozenset[str]
    members: list[Observation]


class DistillProposer:
    name = "distill"
    needs_feedback = True

    def __init__(self, config: SkillsConfig) -> None:
        self.config = config

    def select(self, failures: Sequence[Observation], tree: HarnessTree) -> list[Observation]:
        chosen: list[Observation] = []
        for theme in sorted(self._ready(failures, tree), key=lambda t: -len(t.members)):
            if chosen and len(chosen) + len(theme.members) > self.config.batch_size:
                break
            chosen.extend(theme.members[: self.config.batch_size])
        return chosen

    async def propose(self, tree: HarnessTree, batch: Batch, serving: Any = None) -> Proposal:
        mutations, notes = [], []
        for theme in self._ready(batch.failures, tree):
            mutation = plan(theme, tree, SIMILARITY)
            if mutation is None or any(m.name == mutation.name for m in mutations):
                continue
            mutations.append(mutation)
            notes.append(
                {
                    "rule": mutation.name,
                    "op": mutation.op,
                    "recurrence": len(theme.members),
                    "feedback": central_feedback(theme)[:200],
                }
            )
        if not mutations:
            raise ProposalFailed(
                "no_theme",
                f"no feedback theme recurs {self.config.min_recurrence} times in the "
                "batch without a rule at full strength",
            )
        return Proposal(tuple(mutations), {"proposer": self.name, "themes": notes})

    async def close(self) -> None:
        return None

    def _ready(self, failures: Sequence[Observation], tree: HarnessTree) -> list[Theme]:
        return [
            t
            for t in themes(failures, SIMILARITY)
            if len(t.members) >= self.config.min_recurrence and plan(t, tree, SIMILARITY) is not None
        ]


def plan(theme: Theme, tree: HarnessTree, similarity: float) -> Mutation | None:
    """The change a ready theme asks for: a new rule, a stronger one, or none (already strong)."""
    text = central_feedback(theme)
    existing = rule_of_theme(theme, tree, similarity)
    if existing is None:
        name = rule_name(theme)
        return Mutation("create", "rule", name, text) if name not in tree.rules else None
    if STILL_MISSED in tree.rules[existing]:
        return None
    return Mutation("update", "rule", existing, f"{text}\n{STILL_MISSED}")


def rule_of_theme(theme: Theme, tree: HarnessTree, similarity: float) -> str | None:
    """The rule this proposer made earlier for the same theme (its text shares the words)."""
    for name, body in sorted(tree.rules.items()):
        if (
            name.startswith(RULE_PREFIX)
            and jaccard(normalise(body.replace(STILL_MISSED, "")), theme.words) >= similarity
        ):
            return name
    return None


def normalise(feedback: str) -> frozenset[str]:
    words = set()
    for word in _WORD.findall(feedback.lower()):
        if word in STOPWORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        words.add(word)
    return frozenset(words)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def themes(failures: Sequence[Observation], similarity: float) -> list[Theme]:
    out: list[Theme] = []
    for obs in failures:
        words = normalise(obs.feedback)
        if not words:
            continue
        for theme in out:
            if jaccard(words, theme.words) >= similarity:
                theme.members.append(obs)
                break
        else:
            out.append(Theme(words, [obs]))
    return out


def central_feedback(theme: Theme) -> str:
    """The member feedback most similar to all the others, trimmed to one paragraph."""
    texts = [m.feedback for m in theme.members]
    words = [normalise(t) for t in texts]
    best = max(range(len(texts)), key=lambda i: (sum(jaccard(words[i], w) for w in words), -len(texts[i])))
    return " ".join(texts[best].split())[:MAX_RULE_CHARS]


def rule_name(theme: Theme) -> str:
    """`fb-` and the theme's first feedback words in their order (stable for one theme)."""
    first = theme.members[0].feedback.lower()
    ordered = [w for w in dict.fromkeys(_WORD.findall(first)) if w not in STOPWORDS][:NAME_WORDS]
    slug = "-".join(ordered) or "feedback"
    return (RULE_PREFIX + slug)[:64].rstrip("-_")
