"""Settings for `reef serve`: one model, read once, layered YAML < environment < flags.

Unknown keys are an error that names them, so a typo never silently falls back to a default.
Environment variables: every setting as `REEF_<KEY>`, nested keys joined by `__`
(`REEF_UPSTREAM__TIMEOUT=30`, `REEF_LEARNER__SAO__LR=1e-4`; `_from_env`), and the five older names
`REEF_TOKEN` (one token, or several separated by commas, for rotation), `REEF_UPSTREAM_URL`,
`REEF_UPSTREAM_API_KEY`, `REEF_UPSTREAM_MODEL`, `REEF_STATE_DIR`.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reef.core.dotted import load_dotted
from reef.core.errors import InvalidInput
from reef.core.urls import checked_url

DEFAULT_PORT = 8900


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UpstreamConfig(Strict):
    url: str | None = Field(None, description="Provider base URL, e.g. https://api.openai.com/v1")
    api_key: str | None = Field(None, description="Provider key; never logged")
    model: str | None = Field(None, description="Model sent upstream (unless pass_model_through)")
    dialect: Literal["openai", "anthropic"] = "openai"
    pass_model_through: bool = False
    timeout: float = Field(120.0, gt=0, description="Seconds before an upstream call fails with 502")
    max_response_bytes: int = Field(16 * 1024 * 1024, ge=1024,
                                    description="Largest provider answer (a whole body, or a stream in all); past it, 502")


class EmbeddedConfig(Strict):
    model_dir: Path | None = Field(None, description="A transformers model folder; default: SmolLM2 from the cache")
    cache_dir: Path | None = Field(None, description="Where converted weights live; default ~/.cache/reef")
    max_batch: int = Field(8, ge=1)
    default_max_tokens: int = Field(256, ge=1)
    threads: int | None = Field(None, ge=1)
    min_shared_prefix: int = Field(16, ge=0, description="Prefill a batch's common prompt prefix once when it "
                                                      "has at least this many tokens; 0: off")
    continuous_batching: bool = Field(False, description="A request joins its load's running batch between two "
                                                         "decoding steps instead of waiting for the batch to end: "
                                                         "far lower latency behind long answers, fewer answers a "
                                                         "second while Reef learns (docs/PERFORMANCE.md)")
    turn_steps: int = Field(16, ge=1, description="Decoding steps one load's batch runs before another load "
                                                 "with work (a gate's candidate, the serving release) takes a turn")


class VLLMConfig(Strict):
    """The vLLM runtime (docs/engines.md): a vLLM OpenAI server Reef starts, or one it attaches to."""

    url: str | None = Field(None, description="Attach to this running vLLM (same machine: it reads adapter "
                                             "folders Reef writes); default: Reef starts its own")
    model_dir: Path | None = Field(None, description="A Hugging Face model folder; default: embedded.model_dir, "
                                                    "else SmolLM2 from the cache. With url: the weights the "
                                                    "attached vLLM serves, so the learner can train them")
    model_name: str | None = Field(None, description="The base model's name in /v1/models; default: the folder's")
    env_dir: Path | None = Field(None, description="vLLM's own virtual environment; default <cache>/vllm-env")
    dtype: str = Field("auto", description="--dtype of the engine; auto: float32 while the learner is on (the "
                                          "trainer's weights exactly), else bfloat16")
    max_model_len: int = Field(2048, ge=16)
    max_lora_rank: int = Field(16, ge=1, description="Largest adapter rank vLLM accepts (>= learner.sao.lora_r)")
    max_loras: int = Field(4, ge=1, description="Adapters in one batch")
    kv_cache_gb: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE: GiB of KV cache (CPU build)")
    extra_args: list[str] = Field(default_factory=list, description="More vllm api_server flags")
    startup_timeout: float = Field(600.0, gt=0, description="Seconds vLLM may take to become healthy")
    load_timeout: float = Field(120.0, gt=0, description="Seconds an adapter load may take before it fails")
    timeout: float = Field(120.0, gt=0, description="Seconds one read from vLLM may wait")
    default_max_tokens: int = Field(256, ge=1)


class SGLangConfig(Strict):
    """The SGLang runtime (docs/engines.md): an SGLang server started with --enable-lora, which Reef attaches to."""

    url: str | None = Field(None, description="The SGLang server's address (required by runtime sglang)")
    model_dir: Path | None = Field(None, description="The served model's folder on this machine: its tokenizer "
                                                    "renders prompts, the learner trains its weights; default: "
                                                    "embedded.model_dir, else SGLang's tokenizer_path (no weights "
                                                    "learning)")
    model_name: str | None = Field(None, description="The model name /v1/models lists; default: SGLang's model_path")
    adapter_dir: Path | None = Field(None, description="Where adapter folders are written for SGLang to read (the same "
                                                      "path on its machine); default <cache>/sglang-adapters")
    load_timeout: float = Field(120.0, gt=0, description="Seconds an adapter load may take before it fails")
    timeout: float = Field(120.0, gt=0, description="Seconds one read from SGLang may wait")
    default_max_tokens: int = Field(256, ge=1)


# The built-in recipes by name; any other recipe is named by its dotted path (docs/recipes.md).
RECIPES = {"sao": "reef.recipes.sao:SAORecipe", "skills": "reef.recipes.skills:SkillsRecipe",
           "ttt_discover": "reef.recipes.ttt_discover:TTTDiscoverRecipe",
           "openclaw_rl": "reef.recipes.openclaw_rl:OpenClawRLRecipe"}
RECIPE_PARTS = ("name", "surface", "Settings", "intake", "next_batch", "resume", "high_water", "candidate",
                "status", "close")


def find_recipe(name: str) -> Any:
    """The recipe class a binding names: a built-in by name, or any class by its dotted path
    `package.module:Class` (imported now, so a bad name fails when the config loads)."""
    path = RECIPES.get(name, name)
    if ":" not in path:
        raise InvalidInput(f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)}, "
                           "or a dotted path package.module:Class")
    recipe = load_dotted(path, "recipe", "package.module:Class")
    missing = [part for part in RECIPE_PARTS if not hasattr(recipe, part)]
    if missing:
        raise InvalidInput(f"recipe {name!r} lacks {', '.join(missing)} (see docs/recipes.md)")
    if recipe.surface not in ("weights", "harness"):
        raise InvalidInput(f"recipe {name!r}: surface must be 'weights' or 'harness', not {recipe.surface!r}")
    return recipe


def _known_recipe(name: str) -> str:
    try:
        find_recipe(name)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    return name


class RecipeConfig(Strict):
    default: str = Field("sao", description="Recipe a new scenario is bound to: a name or package.module:Class")
    scenarios: dict[str, str] = Field(default_factory=dict, description="Per-scenario recipe bindings")

    @field_validator("default")
    @classmethod
    def _default_is_known(cls, name: str) -> str:
        return _known_recipe(name)

    @field_validator("scenarios")
    @classmethod
    def _bindings_are_known(cls, bindings: dict[str, str]) -> dict[str, str]:
        for name in bindings.values():
            _known_recipe(name)
        return bindings

    def for_scenario(self, name: str) -> str:
        return self.scenarios.get(name, self.default)


class GateConfig(Strict):
    """How a weights candidate is judged against the serving release."""

    tasks: Path | None = Field(None, description="JSONL of evaluation tasks: {prompt | messages, ...scorer fields}")
    scorer: str | None = Field(None, description="module:function(task, text) -> float, for the tasks")
    max_tokens: int = Field(48, ge=1)
    temperature: float = Field(0.0, ge=0, description="0: greedy, the same answer every time")
    margin: float = Field(0.0, ge=0, description="Mean score gain the candidate must show")
    confidence: float = Field(0.8, gt=0, lt=1, description="One-sided confidence of the paired sign test")
    looks: int = Field(3, ge=1, description="Parts the tasks are answered in, with an early decision possible "
                                            "after each (1: all tasks, then decide)")
    halves: bool | Literal["after_first"] = Field(False, description="Judge each candidate on the fixed half of the "
        "tasks its serving release was not selected on (that release scores high there by luck as well as merit). "
        "after_first: a release no half chose (the base) on every task, so the first selection needs no more margin")
    concurrency: int | None = Field(None, ge=1, description="The gate's requests in flight at once (null: a look's "
                                    "tasks all at once); fewer leave more of the serving runtime to live traffic")
    concurrency_when: Literal["always", "starved"] = Field(
        "always", description="When `concurrency` bounds the gate: always, or only while the learner waits for "
        "samples (a fifth of its time or more: live traffic is what it lacks); otherwise a look's tasks at once")
    after_batches: int = Field(1, ge=1, description="A candidate goes to the gate once its line of training has taken "
                               "this many batches past the release it would replace (1: every candidate); until "
                               "then each waits for the next, which takes its place")
    overtake_after: int | None = Field(None, ge=1, description="A verdict still undecided after a look stops (a reject "
                                       "marked overtaken) once a candidate this many batches further along the same "
                                       "line waits, and the gate judges that one (null: every verdict runs to its "
                                       "decision)")
    live_split: float | None = Field(None, gt=0, lt=1, description="For scenarios with a canary: once three "
                                     "verdicts in a row against one serving release run to their last look undecided, "
                                     "their candidates not behind on the tasks, "
                                     "the canary serves this fraction of "
                                     "requests (in place of learner.canary's) until the head moves, so the line and "
                                     "the serving release are served side by side, and the line's live scores since "
                                     "then join each later verdict's sign test (one combined test at `confidence`, "
                                     "the tasks bringing at least half the evidence; null: off)")
    answer_on: Literal["runtime", "trainer"] = Field(
        "runtime", description="Where the tasks are answered: the serving runtime, beside live traffic, or the "
        "training process, which loads the base model too and waits while the learner waits for samples (greedy "
        "answers only; the same prompt ids, stop tokens and decoding as the embedded runtime)")
    holdout_fraction: float = Field(0.2, ge=0, lt=1, description="Offline check: reported records kept out of training")
    offline_bound: float = Field(0.05, ge=0, description="Offline check: allowed drift of mean log-prob per token")

    @model_validator(mode="after")
    def _starved_needs_a_bound(self) -> GateConfig:
        if self.concurrency_when == "starved" and self.concurrency is None:
            raise ValueError("concurrency_when: starved needs concurrency (the bound it applies while the "
                             "learner waits for samples); set both, or neither")
        if self.answer_on == "trainer" and self.temperature != 0:
            raise ValueError("answer_on: trainer answers greedily; set temperature: 0, or answer_on: runtime")
        return self


class ModelEndpointConfig(Strict):
    """An OpenAI- or Anthropic-compatible model Reef calls itself (proposer, judge)."""

    url: str | None = Field(None, description="Base URL; default: the scenario's own runtime")
    api_key: str | None = Field(None, description="Sent to that model; never logged")
    model: str | None = Field(None, description="Model name sent")
    dialect: Literal["openai", "anthropic"] = "openai"
    timeout: float = Field(120.0, gt=0)
    max_tokens: int = Field(1024, ge=1)
    temperature: float = Field(0.0, ge=0)


class LLMProposerConfig(ModelEndpointConfig):
    tries: int = Field(3, ge=1, description="Calls per batch before invalid output is skipped")


class HarnessGateConfig(Strict):
    """How a harness candidate is judged against the serving harness."""

    tasks: Path | None = Field(None, description="JSONL of evaluation tasks; default: held-out reported prompts")
    scorer: str | None = Field(None, description="module:function(task, text) -> float")
    judge: ModelEndpointConfig | None = Field(None, description="A model that scores answers when no scorer is set")
    margin: int = Field(1, ge=0, description="Wins minus losses the candidate must reach")
    publish: Literal["auto", "review"] = Field("auto", description="review: a selected candidate waits for promote")
    holdout_fraction: float = Field(0.25, ge=0, lt=1, description="Without tasks: reported records kept as gate tasks")
    max_holdout: int = Field(32, ge=1, description="Without tasks: most recent held-out records used")
    max_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.0, ge=0)


class LearnerConfig(Strict):
    """Learning settings; every other key is a recipe's own section (`sao:`, `skills:`, or a
    dotted path), checked by that recipe's `Settings` model."""

    model_config = ConfigDict(extra="allow")

    enabled: bool = Field(True, description="Train scenarios whose recipe learns weights")
    poll_interval: float = Field(0.5, gt=0)
    train_threads: int | None = Field(None, ge=1, description="torch threads of the training process")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where the training process trains: auto "
                                                  "takes a CUDA GPU when torch sees one")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="The trainer's weights: auto is float32 on the CPU, the engine's dtype on a GPU")
    gate: GateConfig = Field(default_factory=GateConfig)
    canary: dict[str, float] = Field(default_factory=dict, description="Scenarios that opt in to a canary: the "
                                     "fraction (0-1] of their requests the weights candidate under test serves")

    @field_validator("canary")
    @classmethod
    def _canary_fractions(cls, value: dict[str, float]) -> dict[str, float]:
        for scenario, fraction in value.items():
            if not 0 < fraction <= 1:
                raise ValueError(f"learner.canary.{scenario} must be a fraction in (0, 1], got {fraction}")
        return value

    @model_validator(mode="after")
    def _recipe_sections(self) -> LearnerConfig:
        for name, section in list((self.model_extra or {}).items()):
            try:
                settings = find_recipe(name).Settings
            except InvalidInput as exc:
                raise ValueError(f"unknown key 'learner.{name}' (not a learner setting: {exc})") from None
            if isinstance(section, settings):
                continue
            try:
                self.model_extra[name] = settings.model_validate(section or {})  # type: ignore[index]
            except ValidationError as exc:
                raise ValueError(_explain_all(exc, f"learner.{name}.")) from None
        return self

    def settings_for(self, recipe: str) -> Any:
        """A recipe's settings: its section, else its defaults."""
        return (self.model_extra or {}).get(recipe) or find_recipe(recipe).Settings()


class HarnessScenarioConfig(Strict):
    mode: Literal["inject", "pull"] | None = Field(None, description="Overrides harness.mode for this scenario")
    seed_dir: Path | None = Field(None, description="Overrides harness.seed_dir for this scenario")


class HarnessConfig(Strict):
    """How a scenario's harness is applied and what a new scenario starts with (docs/harness.md)."""

    mode: Literal["inject", "pull"] = Field("inject", description="inject: added to each request; pull: clients fetch it")
    seed_dir: Path | None = Field(None, description="A harness directory every new scenario starts with")
    scenarios: dict[str, HarnessScenarioConfig] = Field(default_factory=dict, description="Per-scenario overrides")

    def mode_for(self, scenario: str) -> str:
        override = self.scenarios.get(scenario)
        return (override.mode if override and override.mode else None) or self.mode

    def seed_dir_for(self, scenario: str) -> Path | None:
        override = self.scenarios.get(scenario)
        return (override.seed_dir if override and override.seed_dir else None) or self.seed_dir


class TracesConfig(Strict):
    """OpenTelemetry spans per request (docs/observability.md); needs the `traces` extra."""

    enabled: bool = Field(False, description="Make spans; also on when otlp_endpoint is set")
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP base URL; default OTEL_EXPORTER_OTLP_ENDPOINT")
    service_name: str = Field("reef", description="service.name of the spans' resource")

    @property
    def on(self) -> bool:
        return self.enabled or self.otlp_endpoint is not None


class ArtifactsConfig(Strict):
    """Where release contents are shared between front ends (docs/deploy.md)."""

    remote: str | None = Field(None, description="A git URL or the path of a bare repository every front end "
                                                 "publishes to and fetches from; default: none (one node)")


class RequestLimits(Strict):
    """What one request may ask of the server beyond its body size (docs/RELIABILITY.md)."""

    max_header_bytes: int = Field(64 * 1024, ge=4096, description="All request headers together; past it, 431")
    max_tags: int = Field(32, ge=0, description="x-reef-tag-* headers on one request; past it, 400")
    max_tag_bytes: int = Field(1024, ge=1, description="One x-reef-tag-* value; past it, 400")
    max_json_depth: int = Field(64, ge=8, description="Nesting of arrays and objects in a body; past it, 400")
    max_report_references: int = Field(1000, ge=1, description="Receipts one report may name; past it, 400")
    stream_send_timeout: float = Field(30.0, gt=0,
                                       description="Seconds a streaming client may read nothing before its stream is dropped")


class ServeConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    state_dir: Path = Path(".reef")
    tokens: list[str] = Field(default_factory=list, description="Accepted bearer tokens (several for rotation)")
    insecure: bool = Field(False, description="Allow a non-loopback address without a token")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    limits: RequestLimits = Field(default_factory=RequestLimits)
    runtime: Literal["embedded", "upstream", "vllm", "sglang"] | None = Field(
        None, description="Default: upstream if a URL is set")
    store: str = Field("sqlite", description="'sqlite' (in the state dir) or a postgresql:// DSN")
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    shared_state_dir: bool = Field(False, description="Several processes on this machine serve state_dir together "
                                                      "(set for the workers of --workers): each follows the others' "
                                                      "releases, one learner per scenario by a file lock")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = Field("text", description="text: key=value lines; json: one object a line")
    public_url: str | None = Field(None, description="The URL the agent install script names; default: the Host asked")
    keep_alive_timeout: float = Field(5.0, gt=0, description="Seconds an idle connection stays open after an answer")
    header_timeout: float = Field(10.0, gt=0, description="Seconds a client has to send a whole request head")
    body_timeout: float = Field(30.0, gt=0, description="Seconds a request body may fall silent")
    shutdown_timeout: float = Field(15.0, ge=0, description="Seconds SIGTERM waits for running requests, then cancels")
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    embedded: EmbeddedConfig = Field(default_factory=EmbeddedConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    sglang: SGLangConfig = Field(default_factory=SGLangConfig)
    recipes: RecipeConfig = Field(default_factory=RecipeConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    traces: TracesConfig = Field(default_factory=TracesConfig)

    @field_validator("tokens")
    @classmethod
    def _no_empty_tokens(cls, tokens: list[str]) -> list[str]:
        if any(not t.strip() for t in tokens):
            raise ValueError("tokens must not be empty strings")
        return tokens

    @field_validator("public_url")
    @classmethod
    def _plain_public_url(cls, url: str | None) -> str | None:
        return None if url is None else checked_url(url)  # the rule every URL baked into a script meets

    @property
    def runtime_kind(self) -> str:
        return self.runtime or ("upstream" if self.upstream.url else "embedded")

    def check_exposure(self) -> None:
        """Refuse to listen beyond loopback without a token, unless told `insecure`."""
        if self.tokens or self.insecure or _is_loopback(self.host):
            return
        raise InvalidInput(
            f"refusing to listen on {self.host} without a token: set REEF_TOKEN (or tokens: in the config), "
            "or pass --insecure if this network is trusted"
        )


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None, **flags: Any) -> ServeConfig:
    """YAML file < environment < flags (flags that are None are not given)."""
    data: dict[str, Any] = _read_yaml(path) if path else {}
    _merge(data, _from_env(os.environ if env is None else env))
    _merge(data, _unflatten({k: v for k, v in flags.items() if v is not None}))
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(_explain(exc, path)) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput(f"cannot read config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"config {path} must be a mapping of settings")
    return data


# -- the environment: REEF_<KEY>, nested keys joined by "__" (REEF_UPSTREAM__TIMEOUT=30) -------

ENV_PREFIX = "REEF_"
# The five names Reef had before every setting came from the environment, kept as they were.
ENV_ALIASES: dict[str, tuple[str, ...]] = {
    "REEF_TOKEN": ("tokens",),  # one token, or several separated by commas
    "REEF_STATE_DIR": ("state_dir",),
    "REEF_UPSTREAM_URL": ("upstream", "url"),
    "REEF_UPSTREAM_API_KEY": ("upstream", "api_key"),
    "REEF_UPSTREAM_MODEL": ("upstream", "model"),
}
# REEF_ variables that are not settings of `reef serve`: the client commands' (REEF_URL; REEF_TOKEN
# is both), the agent wrapper's (REEF_SCENARIO, REEF_SESSION, REEF_AGENT_*, ...), the model
# cache's, and the tests'. Any other REEF_ variable must name a setting, or `reef serve` refuses it.
ENV_NOT_SETTINGS = frozenset({
    "REEF_URL", "REEF_CACHE_DIR", "REEF_SCENARIO", "REEF_SESSION", "REEF_OPENAI_BASE_URL",
    "REEF_BEGIN", "REEF_END", "REEF_BLOCK", "REEF_FUZZ_SCALE", "REEF_PG_BIN", "REEF_CHROMIUM",
    "REEF_UI_SCREENSHOTS",
})
ENV_NOT_SETTINGS_PREFIXES = ("REEF_AGENT_",)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """Every setting from a `REEF_` variable: the key upper-cased, nested keys joined by `__`
    (`REEF_LEARNER__SAO__LR=1e-4`, `REEF_RECIPES__SCENARIOS__CODING=skills`); the value read as a
    YAML scalar, or JSON/YAML flow for a list or mapping (`REEF_TOKENS='["a", "b"]'`), and taken
    as written where the setting is text. An empty value is unset. A REEF_ variable that names
    no setting (and is not one of ENV_NOT_SETTINGS) is an error that names it."""
    out: dict[str, Any] = {}
    set_by: dict[tuple[str, ...], str] = {}
    problems: list[str] = []
    names = [n for n in env if n.startswith(ENV_PREFIX) and env[n] != "" and n not in ENV_NOT_SETTINGS
             and not n.startswith(ENV_NOT_SETTINGS_PREFIXES)]
    for name in sorted(names, key=lambda n: (n.count("__"), n)):  # a whole section first, its keys over it
        raw = env[name]
        if name in ENV_ALIASES:
            path = ENV_ALIASES[name]
            value: Any = [t.strip() for t in raw.split(",") if t.strip()] if name == "REEF_TOKEN" else raw
        else:
            path = tuple(name[len(ENV_PREFIX):].lower().split("__"))
            field = _env_field(path)
            if field is None:
                problems.append(f"{name} names no setting{_env_hint(name)}")
                continue
            try:
                value = _env_value(raw, field)
            except (yaml.YAMLError, ValidationError) as exc:
                problems.append(f"{name}: {_env_error(exc)}")
                continue
        if path in set_by:
            problems.append(f"{set_by[path]} and {name} both set {'.'.join(path)}")
            continue
        set_by[path] = name
        node = out
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
    if problems:
        raise InvalidInput("environment: " + "; ".join(problems) + " (settings: docs/configuration.md)")
    return out


def _env_field(path: tuple[str, ...]) -> Any:
    """The annotation of the setting at `path` (through models and the keys of mappings), or
    None when there is none."""
    import typing

    annotation: Any = ServeConfig
    for part in path:
        if not part:
            return None
        model = _env_model(annotation)
        if model is LearnerConfig and part in RECIPES and part not in model.model_fields:
            annotation = find_recipe(part).Settings  # learner.<recipe>: that recipe's own section
        elif model is not None:
            field = model.model_fields.get(part)
            if field is None:
                return None
            annotation = typing.Annotated[field.annotation, field]  # with the field's bounds
        elif typing.get_origin(_env_bare(annotation)) is dict:  # recipes.scenarios.<name>, ...
            annotation = typing.get_args(_env_bare(annotation))[1]
        else:
            return None  # a plain value has no keys
    return annotation


def _env_bare(annotation: Any) -> Any:
    """The type inside Annotated[...] and Optional[...] (the first that is not None)."""
    import types
    import typing

    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = options[0] if len(options) == 1 else annotation
    return annotation


def _env_model(annotation: Any) -> type[BaseModel] | None:
    bare = _env_bare(annotation)
    return bare if isinstance(bare, type) and issubclass(bare, BaseModel) else None


def _env_value(raw: str, annotation: Any) -> Any:
    """Text settings take the value as written (`null` or `~` for none); every other setting
    reads it as YAML, checked against the setting's type and bounds here, so that the error names
    the variable."""
    import typing

    from pydantic import TypeAdapter

    bare = _env_bare(annotation)
    text = bare in (str, Path) or (typing.get_origin(bare) is Literal
                                   and all(isinstance(a, str) for a in typing.get_args(bare)))
    value = (None if raw in ("null", "~") else raw) if text else yaml.safe_load(raw)
    TypeAdapter(annotation).validate_python(value)
    return value


def _env_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(e["msg"] for e in exc.errors())
    return f"not a YAML value: {str(exc).splitlines()[0]}"


def _env_hint(name: str) -> str:
    """Did you mean ...: the setting whose variable differs only in `_` against `__`."""
    loose = name.replace("__", "_")
    for candidate in _env_names(ServeConfig):
        if candidate.replace("__", "_") == loose:
            return f" (did you mean {candidate}? nested keys are joined by a double underscore)"
    return ""


def _env_names(model: type[BaseModel], prefix: str = ENV_PREFIX) -> list[str]:
    """The variable of every setting, nested ones too (the keys of mappings excepted)."""
    names = []
    for key, field in model.model_fields.items():
        name = prefix + key.upper()
        names.append(name)
        sub = _env_model(field.annotation)
        if sub is not None:
            names += _env_names(sub, name + "__")
    return names


def _unflatten(flags: dict[str, Any]) -> dict[str, Any]:
    """`upstream__url=...` becomes {"upstream": {"url": ...}}."""
    out: dict[str, Any] = {}
    for key, value in flags.items():
        parts = key.split("__")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _explain(exc: ValidationError, path: Path | None) -> str:
    where = f"config {path}" if path else "settings"
    return f"{where}: " + _explain_all(exc)


def _explain_all(exc: ValidationError, prefix: str = "") -> str:
    problems = []
    for err in exc.errors():
        loc = prefix + ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            problems.append(f"unknown key '{loc}'")
        elif err["type"] == "value_error":  # our validators' own words; a model's name where they are
            message = str(err["ctx"]["error"])
            problems.append(message if message.startswith(loc) or "'" + loc in message else f"{loc}: {message}")
        else:
            problems.append(f"{loc}: {err['msg']}")
    return "; ".join(problems)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
