"""Settings for `reef serve`: one model, read once, layered YAML < environment < flags.

Unknown keys are an error that names them, so a typo never silently falls back to a default.
The model is `ServeConfig` (serve.py), its sections in runtimes.py and learner.py; environment
variables are read by env.py (`REEF_<KEY>`, nested keys joined by `__`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import ValidationError

from reef.config.env import ENV_NOT_SETTINGS, from_env
from reef.config.learner import (
    RECIPES,
    GateConfig,
    HarnessGateConfig,
    LearnerConfig,
    ModelEndpointConfig,
    RecipeConfig,
    find_recipe,
)
from reef.config.runtimes import EmbeddedConfig, SGLangConfig, UpstreamConfig, VLLMConfig
from reef.config.serve import (
    DEFAULT_PORT,
    ArtifactsConfig,
    HarnessConfig,
    HarnessScenarioConfig,
    RequestLimits,
    ServeConfig,
    TracesConfig,
)
from reef.config.strict import explain_errors
from reef.core.errors import InvalidInput

__all__ = [
    "DEFAULT_PORT",
    "ENV_NOT_SETTINGS",
    "RECIPES",
    "ArtifactsConfig",
    "EmbeddedConfig",
    "GateConfig",
    "HarnessConfig",
    "HarnessGateConfig",
    "HarnessScenarioConfig",
    "LearnerConfig",
    "ModelEndpointConfig",
    "RecipeConfig",
    "RequestLimits",
    "SGLangConfig",
    "ServeConfig",
    "TracesConfig",
    "UpstreamConfig",
    "VLLMConfig",
    "find_recipe",
    "load_config",
]


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None, **flags: Any) -> ServeConfig:
    """YAML file < environment < flags (flags that are None are not given)."""
    data: dict[str, Any] = _read_yaml(path) if path else {}
    _merge(data, from_env(os.environ if env is None else env))
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
    return f"{where}: " + explain_errors(exc)
