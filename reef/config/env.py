"""Settings from the environment: every setting as `REEF_<KEY>`, nested keys joined by `__`
(`REEF_UPSTREAM__TIMEOUT=30`, `REEF_LEARNER__SAO__LR=1e-4`), and the five older names
`REEF_TOKEN` (one token, or several separated by commas, for rotation), `REEF_UPSTREAM_URL`,
`REEF_UPSTREAM_API_KEY`, `REEF_UPSTREAM_MODEL`, `REEF_STATE_DIR`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from reef.config.learner import RECIPES, LearnerConfig, find_recipe
from reef.config.serve import ServeConfig
from reef.core.errors import InvalidInput

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
ENV_NOT_SETTINGS = frozenset(
    {
        "REEF_URL",
        "REEF_CACHE_DIR",
        "REEF_SCENARIO",
        "REEF_SESSION",
        "REEF_OPENAI_BASE_URL",
        "REEF_BEGIN",
        "REEF_END",
        "REEF_BLOCK",
        "REEF_FUZZ_SCALE",
        "REEF_PG_BIN",
        "REEF_CHROMIUM",
        "REEF_UI_SCREENSHOTS",
    }
)
ENV_NOT_SETTINGS_PREFIXES = ("REEF_AGENT_",)


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """Every setting from a `REEF_` variable: the key upper-cased, nested keys joined by `__`
    (`REEF_LEARNER__SAO__LR=1e-4`, `REEF_RECIPES__SCENARIOS__CODING=skills`); the value read as a
    YAML scalar, or JSON/YAML flow for a list or mapping (`REEF_TOKENS='["a", "b"]'`), and taken
    as written where the setting is text. An empty value is unset. A REEF_ variable that names
    no setting (and is not one of ENV_NOT_SETTINGS) is an error that names it."""
    out: dict[str, Any] = {}
    set_by: dict[tuple[str, ...], str] = {}
    problems: list[str] = []
    names = [
        n
        for n in env
        if n.startswith(ENV_PREFIX)
        and env[n] != ""
        and n not in ENV_NOT_SETTINGS
        and not n.startswith(ENV_NOT_SETTINGS_PREFIXES)
    ]
    for name in sorted(names, key=lambda n: (n.count("__"), n)):  # a whole section first, its keys over it
        raw = env[name]
        if name in ENV_ALIASES:
            path = ENV_ALIASES[name]
            value: Any = [t.strip() for t in raw.split(",") if t.strip()] if name == "REEF_TOKEN" else raw
        else:
            path = tuple(name[len(ENV_PREFIX) :].lower().split("__"))
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
    text = bare in (str, Path) or (
        typing.get_origin(bare) is Literal and all(isinstance(a, str) for a in typing.get_args(bare))
    )
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
