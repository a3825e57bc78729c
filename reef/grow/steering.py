"""What an operator steers a learner by while it runs, read from the scenario's commit log at each
step, so a change on any front end reaches the learner wherever it runs, and survives a restart.

- The training mode (`reef.commit.scenario_settings`): `auto` learns from traffic alone (Reef's
  behaviour before modes); `manual` learns only from instructions and from a batch an operator
  asks for (`train_now`, answered by the next batch logged); `hybrid` does both. In every mode
  the learner keeps reading reports, so what waits is there when a batch is asked for.
- The live settings (`reef.grow.live_settings`): at a new revision the recipe's settings are
  replaced by the config's with the changes applied (its next batch and candidate read them),
  the canary's fraction is set for its next candidate, and the gate's thresholds go with each
  candidate made from then on (`LearnedCandidate.gate_overrides`).
"""

from __future__ import annotations

import logging
from typing import Any

from reef.commit.scenario_settings import RECENT_INSTRUCTIONS, ScenarioSettings
from reef.config import GateConfig
from reef.core.errors import InvalidInput
from reef.core.types import CommitEntry
from reef.grow.instructions import instruction_progress, takes_instructions
from reef.grow.live_settings import LiveBase, resolve

log = logging.getLogger("reef.learner")
GATE_FIELDS = {"gate_margin": "margin", "gate_confidence": "confidence"}


class Steering:
    def __init__(self, recipe: Any, canary: Any) -> None:
        self.recipe = recipe
        self.canary = canary  # reef.grow.canary.CanaryLoop: its `fraction` serves the next candidate
        self.base = getattr(recipe, "config", None)  # the config's settings, before any live change
        self.base_fraction = canary.fraction
        self.settings = ScenarioSettings(0, "auto", {}, 0, ())
        self.gate_overrides: dict[str, Any] = {}
        self.history: list[CommitEntry] = []

    def refresh(self, history: list[CommitEntry]) -> None:
        settings = ScenarioSettings.of(history)
        if settings.revision != self.settings.revision:
            self._apply(settings.live)
        self.settings, self.history = settings, history

    def status(self) -> dict[str, Any]:
        """The learner status's part: the mode, a pending train-now, the latest instructions."""
        recent = self.settings.instructions[-RECENT_INSTRUCTIONS:]
        return {
            "training_mode": self.settings.training_mode,
            "train_now_pending": bool(self.settings.train_now),
            "settings_revision": self.settings.revision,
            "instructions": [instruction_row(self.history, i.id) for i in reversed(recent)],
        }

    def from_traffic(self) -> bool:
        """Whether reported traffic may make a batch now."""
        return self.settings.training_mode != "manual" or bool(self.settings.train_now)

    def may_ask(self) -> bool:
        """Whether to ask the recipe for a batch now (for instructions alone, in manual mode)."""
        return self.from_traffic() or takes_instructions(self.recipe)

    def _apply(self, live: dict[str, Any]) -> None:
        if self.base is not None:
            base = LiveBase(self.recipe.surface, self.base, GateConfig(), self.base_fraction, 1.0)
            try:
                settings, _, fraction = resolve(base, live)
            except InvalidInput as exc:  # checked when logged; a later Reef's stricter bounds keep the config's
                log.warning("scenario settings changed live are not valid here, the config's stay: %s", exc)
                settings, fraction = self.base, self.base_fraction
            self.recipe.config = settings
            proposer = getattr(self.recipe, "proposer", None)
            if isinstance(getattr(proposer, "config", None), type(settings)):
                proposer.config = settings  # the skills proposers read the recipe's settings
            if fraction is not None:
                self.canary.fraction = fraction
        self.gate_overrides = {GATE_FIELDS[k]: v for k, v in live.items() if k in GATE_FIELDS}


def instruction_row(history: list[CommitEntry], instruction_id: str) -> dict[str, Any]:
    """One instruction as the learner status lists it (as `GET /reef/train/{id}` gives its progress)."""
    return {"instruction_id": instruction_id, **instruction_progress(history, instruction_id)}
