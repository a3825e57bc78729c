"""The learner settings an operator may change while a scenario serves, and what they resolve to.

A small, explicit allow-list (`LIVE_FIELDS`): each is read by the learner at its next batch or
candidate, none needs a restart or touches what is already trained. Everything else (the LoRA
shape, the gate's tasks, the proposer, the recipe itself) is fixed at start and refused by name.
A change is checked against the recipe's own settings model (its bounds: `lr > 0`, a batch of at
least 1), so a value `reef serve` would refuse in the config is refused here too, and nothing is
logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from reef.config import GateConfig
from reef.config.strict import explain_errors
from reef.core.errors import InvalidInput

LIVE_FIELDS = {
    "lr": "the optimiser's learning rate (weights recipes)",
    "batch_size": "what makes one batch: the recipe's batch_size, turns_per_batch or groups_per_batch",
    "gate_margin": "the gain a candidate must show: learner.gate.margin, or a harness recipe's gate.margin",
    "gate_confidence": "the weights gate's one-sided confidence (learner.gate.confidence)",
    "canary_fraction": "the fraction of requests the scenario's canary serves (scenarios in learner.canary)",
}
BATCH_FIELDS = ("batch_size", "turns_per_batch", "groups_per_batch")
SECRET_KEYS = ("api_key",)


@dataclass(frozen=True)
class LiveBase:
    """A scenario's settings as the config gives them, before any live change."""

    surface: str
    recipe_settings: BaseModel
    gate: GateConfig  # learner.gate (the weights gate)
    canary_fraction: float | None  # learner.canary.<scenario>; None: no canary
    canary_max_fraction: float

    def batch_field(self) -> str | None:
        fields = type(self.recipe_settings).model_fields
        return next((name for name in BATCH_FIELDS if name in fields), None)

    def harness_gate(self) -> BaseModel | None:
        gate = getattr(self.recipe_settings, "gate", None)
        return gate if self.surface == "harness" and isinstance(gate, BaseModel) else None

    def supported(self) -> list[str]:
        """The live fields this scenario's recipe has."""
        names = []
        if "lr" in type(self.recipe_settings).model_fields:
            names.append("lr")
        if self.batch_field():
            names.append("batch_size")
        if self.surface == "weights" or self.harness_gate() is not None:
            names.append("gate_margin")
        if self.surface == "weights":
            names.append("gate_confidence")
        if self.canary_fraction is not None and self.surface == "weights":  # a canary serves weights candidates
            names.append("canary_fraction")
        return names


def resolve(base: LiveBase, live: dict[str, Any]) -> tuple[BaseModel, GateConfig, float | None]:
    """The recipe's settings, the weights gate's and the canary fraction with `live` applied."""
    recipe_update: dict[str, Any] = {}
    if "lr" in live:
        recipe_update["lr"] = live["lr"]
    if "batch_size" in live and (field := base.batch_field()):
        recipe_update[field] = live["batch_size"]
    gate = base.gate
    harness_gate = base.harness_gate()
    if "gate_margin" in live and harness_gate is not None:
        recipe_update["gate"] = _validated(harness_gate, {"margin": live["gate_margin"]}, "gate_margin")
    elif "gate_margin" in live:
        gate = _validated(gate, {"margin": live["gate_margin"]}, "gate_margin")
    if "gate_confidence" in live:
        gate = _validated(gate, {"confidence": live["gate_confidence"]}, "gate_confidence")
    settings = (
        _validated(base.recipe_settings, recipe_update, ", ".join(live)) if recipe_update else base.recipe_settings
    )
    return settings, gate, live.get("canary_fraction", base.canary_fraction)


def check_changes(base: LiveBase, changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` if every one may change live here and has a valid value; else `InvalidInput`
    naming the field."""
    supported = base.supported()
    for name, value in changes.items():
        if name not in LIVE_FIELDS:
            raise InvalidInput(
                f"{name!r} cannot be changed while the scenario serves; the live settings are "
                f"{', '.join(LIVE_FIELDS)} (others: the config file and a restart)"
            )
        if name not in supported:
            raise InvalidInput(f"{name!r} does not apply to this scenario (its live settings: {', '.join(supported)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInput(f"{name} must be a number, got {value!r}")
    fraction = changes.get("canary_fraction")
    if fraction is not None and not 0 < fraction <= base.canary_max_fraction:
        raise InvalidInput(
            f"canary_fraction must be in (0, {base.canary_max_fraction}] (learner.canary_max_fraction), got {fraction}"
        )
    resolve(base, changes)
    return dict(changes)


def effective(base: LiveBase, live: dict[str, Any]) -> dict[str, Any]:
    """Every live field of the scenario with its value now."""
    settings, gate, fraction = resolve(base, live)
    values: dict[str, Any] = {}
    for name in base.supported():
        if name == "lr":
            values[name] = getattr(settings, "lr")
        elif name == "batch_size":
            values[name] = getattr(settings, base.batch_field() or "")
        elif name == "gate_margin":
            harness_gate = getattr(settings, "gate", None) if base.harness_gate() is not None else None
            values[name] = getattr(harness_gate or gate, "margin")
        elif name == "gate_confidence":
            values[name] = gate.confidence
        else:
            values[name] = fraction
    return values


def redacted(settings: BaseModel) -> dict[str, Any]:
    """A settings model as JSON, with every secret (an endpoint's api_key) shown only as set or not."""
    return _redact(settings.model_dump(mode="json"))


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("***" if v else None) if k in SECRET_KEYS else _redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def _validated(model: Any, update: dict[str, Any], what: str) -> Any:
    try:
        return type(model).model_validate({**model.model_dump(), **update})
    except ValidationError as exc:
        raise InvalidInput(f"{what}: {explain_errors(exc)}") from None
