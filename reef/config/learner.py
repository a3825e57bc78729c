"""Settings of learning: which recipe a scenario is bound to, how the gates judge candidates,
the canary, and each recipe's own section (checked by that recipe's `Settings` model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from reef.config.strict import Strict, explain_errors
from reef.core.dotted import load_dotted
from reef.core.errors import InvalidInput

# The built-in recipes by name; any other recipe is named by its dotted path (docs/recipes.md).
RECIPES = {
    "sao": "reef.recipes.sao:SAORecipe",
    "skills": "reef.recipes.skills:SkillsRecipe",
    "ttt_discover": "reef.recipes.ttt_discover:TTTDiscoverRecipe",
    "openclaw_rl": "reef.recipes.openclaw_rl:OpenClawRLRecipe",
    "skillclaw": "reef.recipes.skillclaw:SkillClawRecipe",
}
RECIPE_PARTS = (
    "name",
    "surface",
    "Settings",
    "intake",
    "next_batch",
    "resume",
    "high_water",
    "candidate",
    "status",
    "close",
)


def find_recipe(name: str) -> Any:
    """The recipe class a binding names: a built-in by name, or any class by its dotted path
    `package.module:Class` (imported now, so a bad name fails when the config loads)."""
    path = RECIPES.get(name, name)
    if ":" not in path:
        raise InvalidInput(
            f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)}, or a dotted path package.module:Class"
        )
    recipe = load_dotted(path, "recipe", "package.module:Class")
    if not isinstance(recipe, type):
        raise InvalidInput(f"recipe {name!r} names a {type(recipe).__name__}, not a recipe class (see docs/recipes.md)")
    missing = [part for part in RECIPE_PARTS if not hasattr(recipe, part)]
    if missing:
        raise InvalidInput(f"recipe {name!r} is not a recipe: it lacks {', '.join(missing)} (see docs/recipes.md)")
    if recipe.surface not in ("weights", "harness"):
        raise InvalidInput(f"recipe {name!r}: surface must be 'weights' or 'harness', not {recipe.surface!r}")
    if recipe.surface == "harness" and not hasattr(recipe, "harness_gate"):
        raise InvalidInput(
            f"recipe {name!r} is a harness recipe without harness_gate, the settings its candidates "
            "are judged by (see docs/recipes.md)"
        )
    return recipe


# The default bound on a canary's fraction (learner.canary_max_fraction)
CANARY_MAX_FRACTION = 0.1


def _known_recipe(name: str) -> str:
    try:
        find_recipe(name)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    return name


# What a new scenario learns when no recipe is configured: its weights where the runtime can load
# trained weights, else its harness (an upstream provider's weights are out of reach)
WEIGHTS_DEFAULT, HARNESS_DEFAULT = "sao", "skills"


class RecipeConfig(Strict):
    default: str | None = Field(
        None,
        description="Recipe a new scenario is bound to: a name or package.module:Class; unset: sao "
        "where the runtime can load trained weights, skills (the harness) where it cannot (upstream)",
    )
    scenarios: dict[str, str] = Field(default_factory=dict, description="Per-scenario recipe bindings")

    @field_validator("default")
    @classmethod
    def _default_is_known(cls, name: str | None) -> str | None:
        return None if name is None else _known_recipe(name)

    @field_validator("scenarios")
    @classmethod
    def _bindings_are_known(cls, bindings: dict[str, str]) -> dict[str, str]:
        for name in bindings.values():
            _known_recipe(name)
        return bindings

    def for_scenario(self, name: str, runtime_loads_weights: bool = True) -> str:
        return self.choose(name, "", runtime_loads_weights)[0]

    def choose(self, name: str, runtime: str, runtime_loads_weights: bool) -> tuple[str, str]:
        """The recipe a new scenario `name` is bound to on `runtime`, and why (`/reef/status`)."""
        if name in self.scenarios:
            return self.scenarios[name], f"recipes.scenarios.{name}"
        if self.default is not None:
            return self.default, "recipes.default"
        if runtime_loads_weights:
            return WEIGHTS_DEFAULT, f"default for the {runtime} runtime, which loads trained weights"
        return HARNESS_DEFAULT, f"default for the {runtime} runtime, which cannot load trained weights"


class GateConfig(Strict):
    """How a weights candidate is judged against the serving release."""

    tasks: Path | None = Field(None, description="JSONL of evaluation tasks: {prompt | messages, ...scorer fields}")
    scorer: str | None = Field(
        None,
        description="module:function(task, text) -> float for the tasks, imported (and the "
        "tasks read) before reef serve starts",
    )
    max_tokens: int = Field(48, ge=1, description="Tokens of one evaluation answer")
    temperature: float = Field(0.0, ge=0, description="0: greedy, the same answer every time")
    margin: float = Field(0.0, ge=0, description="Mean score gain the candidate must show")
    confidence: float = Field(0.8, gt=0, lt=1, description="One-sided confidence of the paired sign test")
    looks: int = Field(
        3,
        ge=1,
        description="Parts the tasks are answered in, with an early decision possible "
        "after each (1: all tasks, then decide)",
    )
    halves: bool | Literal["after_first"] = Field(
        False,
        description="Judge each candidate on the fixed half of the "
        "tasks its serving release was not selected on (after_first: the base's candidates on every task)",
    )
    concurrency: int | None = Field(
        None,
        ge=1,
        description="The gate's requests in flight at once (null: a look's "
        "tasks all at once); fewer leave more of the serving runtime to live traffic",
    )
    concurrency_when: Literal["always", "starved"] = Field(
        "always",
        description="When `concurrency` bounds the gate: always, or only while the learner waits for "
        "samples (a fifth of its time or more: live traffic is what it lacks); otherwise a look's tasks at once",
    )
    after_batches: int = Field(
        1,
        ge=1,
        description="A candidate goes to the gate once its line of training has taken "
        "this many batches past the release it would replace (1: every candidate); until "
        "then each waits for the next, which takes its place",
    )
    live_split: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="With a canary, once three verdicts in a row end "
        "undecided, it serves this fraction and the line's live scores join the gate's "
        "test (docs/learning.md; null: off)",
    )
    answer_on: Literal["runtime", "trainer"] = Field(
        "runtime",
        description="Where the tasks are answered: the serving runtime, beside live traffic, or greedily in "
        "the training process while it waits for samples (docs/learning.md)",
    )
    holdout_fraction: float = Field(0.2, ge=0, lt=1, description="Offline check: reported records kept out of training")
    offline_bound: float = Field(0.05, ge=0, description="Offline check: allowed drift of mean log-prob per token")

    @model_validator(mode="after")
    def _starved_needs_a_bound(self) -> GateConfig:
        if self.concurrency_when == "starved" and self.concurrency is None:
            raise ValueError(
                "concurrency_when: starved needs concurrency (the bound it applies while the "
                "learner waits for samples); set both, or neither"
            )
        if self.answer_on == "trainer" and self.temperature != 0:
            raise ValueError("answer_on: trainer answers greedily; set temperature: 0, or answer_on: runtime")
        return self


class ModelEndpointConfig(Strict):
    """An OpenAI- or Anthropic-compatible model Reef calls itself (proposer, judge)."""

    url: str | None = Field(None, description="Base URL; default: the scenario's own runtime")
    api_key: str | None = Field(None, description="Sent to that model; never logged")
    model: str | None = Field(None, description="Model name sent")
    dialect: Literal["openai", "anthropic"] = Field("openai", description="The API that model speaks")
    timeout: float = Field(120.0, gt=0, description="Seconds per read before a call fails")
    max_tokens: int = Field(1024, ge=1, description="Tokens of one answer")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of its answers")


class HarnessGateConfig(Strict):
    """How a harness candidate is judged against the serving harness."""

    tasks: Path | None = Field(None, description="JSONL of evaluation tasks; default: held-out reported prompts")
    scorer: str | None = Field(None, description="module:function(task, text) -> float")
    judge: ModelEndpointConfig | None = Field(None, description="A model that scores answers when no scorer is set")
    margin: int = Field(1, ge=0, description="Wins minus losses the candidate must reach")
    publish: Literal["auto", "review"] = Field("auto", description="review: a selected candidate waits for promote")
    holdout_fraction: float = Field(0.25, ge=0, lt=1, description="Without tasks: reported records kept as gate tasks")
    max_tokens: int = Field(128, ge=1, description="Tokens of one evaluation answer")
    temperature: float = Field(0.0, ge=0, description="0: greedy, the same answer every time")


class LearnerConfig(Strict):
    """Learning settings; every other key is a recipe's own section (`sao:`, `skills:`, or a
    dotted path), checked by that recipe's `Settings` model."""

    model_config = ConfigDict(extra="allow")

    enabled: bool = Field(True, description="Train scenarios whose recipe learns weights")
    poll_interval: float = Field(0.5, gt=0, description="Seconds between looks at new reports when idle")
    train_threads: int | None = Field(
        None, ge=1, description="Torch threads of the training process; default: half the cores"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the training process trains: auto takes a CUDA GPU when torch sees one"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="The trainer's weights: auto is float32 on the CPU, the engine's dtype on a GPU"
    )
    weights: Literal["lora", "full"] = Field(
        "lora", description="What training changes: a LoRA adapter, or every weight of the model (full)"
    )
    ranks: int = Field(
        1, ge=1, description="Training processes on this machine (one per GPU); above 1, a torchrun job with FSDP2"
    )
    nodes: int = Field(1, ge=1, description="Machines the training job spans, each running learner.ranks ranks")
    rendezvous: str | None = Field(
        None, description="host:port where the other nodes reach this one (rank 0's); needed when nodes > 1"
    )
    gate: GateConfig = Field(default_factory=GateConfig)
    canary: dict[str, float] = Field(
        default_factory=dict,
        description="Scenarios that opt in to a canary: the "
        "fraction of their requests served by the candidate under test, which the gate "
        "has not selected",
    )
    # 0.1: a candidate the gate has not judged (a sabotaged one too, until its verdict or withdrawal)
    # reaches at most one request in ten, while a canary still brings its line on-policy samples
    canary_max_fraction: float = Field(
        CANARY_MAX_FRACTION,
        gt=0,
        le=1,
        description="The largest fraction a canary "
        "or gate.live_split may serve, a larger one refused at start; raise it only "
        "knowingly",
    )

    @model_validator(mode="after")
    def _ranks_train_full_weights(self) -> LearnerConfig:
        if (self.ranks > 1 or self.nodes > 1) and self.weights != "full":
            raise ValueError("learner.ranks and learner.nodes above 1 need learner.weights: full")
        if self.nodes > 1 and not self.rendezvous:
            raise ValueError("learner.nodes > 1 needs learner.rendezvous, host:port of this machine")
        return self

    @field_validator("canary")
    @classmethod
    def _canary_fractions(cls, value: dict[str, float]) -> dict[str, float]:
        for scenario, fraction in value.items():
            if not 0 < fraction <= 1:
                raise ValueError(f"learner.canary.{scenario} must be a fraction in (0, 1], got {fraction}")
        return value

    @model_validator(mode="after")
    def _canary_within_bound(self) -> LearnerConfig:
        bound = self.canary_max_fraction
        asked = {f"learner.canary.{scenario}": fraction for scenario, fraction in self.canary.items()}
        if self.gate.live_split is not None and self.canary:  # the split serves only through a canary
            asked["learner.gate.live_split"] = self.gate.live_split
        for name, fraction in asked.items():
            if fraction > bound:
                raise ValueError(
                    f"{name} is {fraction}, above learner.canary_max_fraction ({bound}): a canary's "
                    "requests are served by a candidate the gate has not selected; lower it, or raise "
                    "learner.canary_max_fraction knowingly"
                )
        return self

    @model_validator(mode="after")
    def _recipe_sections(self) -> LearnerConfig:
        named: dict[type, str] = {}  # one section a recipe: `sao` and its dotted path name the same one
        for name, section in list((self.model_extra or {}).items()):
            try:
                recipe = find_recipe(name)
            except InvalidInput as exc:
                raise ValueError(f"unknown key 'learner.{name}' (not a learner setting: {exc})") from None
            if recipe in named:
                raise ValueError(
                    f"learner.{named[recipe]} and learner.{name} are both the settings of recipe "
                    f"{recipe.name!r}; keep one"
                )
            named[recipe] = name
            settings = recipe.Settings
            if isinstance(section, settings):
                continue
            try:
                self.model_extra[name] = settings.model_validate(section or {})  # type: ignore[index]
            except ValidationError as exc:
                raise ValueError(explain_errors(exc, f"learner.{name}.")) from None
        return self

    def settings_for(self, recipe: str) -> Any:
        """A recipe's settings: its section, else its defaults. A section is found by the recipe it
        names, so a scenario bound to `reef.recipes.sao:SAORecipe` gets `learner.sao` (and one
        bound to `sao` a section under the dotted path)."""
        wanted = find_recipe(recipe)
        for name, section in (self.model_extra or {}).items():
            if find_recipe(name) is wanted:
                return section
        return wanted.Settings()
