"""Which recipe each scenario learns with, and why: said at start and in `/reef/status`.

A new scenario is bound for life to the recipe the config names for it (`recipes.scenarios`,
`recipes.default`) or, with none named, to what its runtime can learn: its weights (`sao`) where
the runtime loads trained weights, its harness (`skills`) where it cannot (an upstream provider).
"""

from __future__ import annotations

from typing import Any

from reef.commit.state import ReefState
from reef.config import RecipeConfig, ServeConfig, find_recipe
from reef.core.errors import InvalidInput
from reef.runtimes.base import Runtime, loads_trained_weights

CHANGE_IT = "recipes.default or recipes.scenarios.<name> change it (docs/recipes.md)"


def recipe_bindings(state: ReefState, recipes: RecipeConfig, runtime: Runtime) -> list[dict[str, Any]]:
    """Per scenario: its recipe, the surface it learns, and why it was chosen."""
    entries = []
    for name in state.scenarios():
        bound = state.chain(name).binding["recipe"]
        chosen, why = recipes.choose(name, runtime.name, loads_trained_weights(runtime))
        if bound != chosen:  # bound by an earlier config: a scenario keeps its recipe for life
            why = f"bound when the scenario was created; the config now says {chosen} ({why}) for a new scenario"
        entries.append({"scenario": name, "recipe": bound, "surface": _surface(bound), "why": why})
    return entries


def learning_lines(config: ServeConfig, runtime: Runtime) -> list[str]:
    """What learns on this runtime and how to change it: the lines `reef serve` prints at start."""
    if not config.learner.enabled:
        return ["learning: off (learner.enabled: false); reports are still recorded"]
    loads_weights = loads_trained_weights(runtime)
    recipe, why = config.recipes.choose("", runtime.name, loads_weights)
    if config.recipes.default is None:
        what = "weights" if loads_weights else "harness (system prompt, rules, skills)"
        line = f"learning: a new scenario learns its {what} from reports with recipe {recipe} ({why}); {CHANGE_IT}"
    else:
        line = f"learning: a new scenario is bound to recipe {recipe} (recipes.default)"
    lines = [line]
    if _surface(recipe) == "weights" and not loads_weights:
        lines.append(
            f"learning: recipe {recipe} trains weights, which the {runtime.name} runtime cannot load: its "
            "scenarios will not learn; bind them to skills, or unset recipes.default"
        )
    return lines


def _surface(recipe: str) -> str | None:
    try:
        return str(find_recipe(recipe).surface)
    except InvalidInput:  # bound by an earlier config that knew it
        return None
