"""A scenario's canary as the server runs it: the learner (`reef.grow.canary`) starts one for
each weights candidate it sends to the gate and stops it with the verdict or when live scores
are worse; `ScenarioDirectory` admits `fraction` of the scenario's new requests to it (never a
request that names its release) and unloads it once the last of them ends. Only scenarios named
in `learner.canary` get one."""

from __future__ import annotations

from typing import Mapping

from reef.grow.canary import canary_release_id
from reef.serve.scenarios import ScenarioDirectory


class ScenarioCanary:
    def __init__(self, scenarios: ScenarioDirectory, scenario: str, fraction: float) -> None:
        self.scenarios = scenarios
        self.scenario = scenario
        self.fraction = fraction

    async def start(self, batch_id: str, files: Mapping[str, bytes]) -> str:
        ref = await self.scenarios.start_canary(self.scenario, canary_release_id(batch_id), files, self.fraction)
        return ref.release_id

    async def stop(self) -> None:
        await self.scenarios.stop_canary(self.scenario)
