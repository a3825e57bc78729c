"""Proposers of the `skills` recipe: what turns a batch of failures into harness mutations.

`distill` (no model: recurring feedback becomes a rule) and `llm` (a configured model returns
mutations as schema-checked JSON). `build_proposer` picks one from the config.
"""

from __future__ import annotations

from reef.recipes.skills import Proposer, SkillsConfig
from reef.runtimes.base import Runtime


def build_proposer(config: SkillsConfig, runtime: Runtime) -> Proposer:
    if config.proposer == "llm":
        from reef.recipes.proposers.llm import LLMProposer
        from reef.runtimes.endpoint import ModelEndpoint

        return LLMProposer(config, ModelEndpoint(config.llm, runtime))
    from reef.recipes.proposers.distill import DistillProposer

    return DistillProposer(config)
