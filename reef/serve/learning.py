"""Learning beside serving: one learner per scenario, for weights (`sao`) or the harness (`skills`).

Learners run as tasks on the server's event loop and share one training process, which serves
their jobs round-robin, so several scenarios train at once without one starving another. A
scenario whose recipe needs weights but whose runtime cannot load them (an upstream provider)
is listed with the reason instead of a learner. A scenario bound to `skills` gets a harness
learner on any runtime (upstream or embedded): it needs no training process, only the runtime
to answer the gate's tasks (and, by default, the LLM proposer's prompt).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from reef.commit.gate import WeightsGate
from reef.commit.harness_gate import HarnessGate
from reef.commit.harness_publisher import HarnessPublisher
from reef.commit.publisher import CandidatePublisher
from reef.commit.state import ReefState
from reef.config import LearnerConfig
from reef.core.errors import InvalidInput
from reef.core.types import Verdict
from reef.grow.harness_learner import HarnessLearner
from reef.grow.learner import WeightsLearner
from reef.grow.worker import TrainingWorker
from reef.recipes.proposers import build_proposer
from reef.recipes.sao import NAME as SAO, SAORecipe
from reef.recipes.skills import NAME as SKILLS, SkillsRecipe
from reef.runtimes.base import Runtime
from reef.serve.scenarios import ScenarioDirectory

log = logging.getLogger("reef.learning")


class Learning:
    def __init__(self, config: LearnerConfig, state: ReefState, runtime: Runtime, scenarios: ScenarioDirectory) -> None:
        self.config = config
        self.state = state
        self.runtime = runtime
        self.scenarios = scenarios
        self.learners: dict[str, WeightsLearner | HarnessLearner] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.idle: dict[str, str] = {}  # scenario -> why it has no learner
        self.worker: TrainingWorker | None = None
        self._gate: WeightsGate | None = None
        self._harness_gate: HarnessGate | None = None

    def _can_train(self) -> str | None:
        if not self.config.enabled:
            return "learning is disabled (learner.enabled: false)"
        if getattr(self.runtime, "model_dir", None) is None:
            return f"the {self.runtime.name} runtime cannot load trained weights"
        return None

    async def start(self) -> None:
        for name in self.state.scenarios():
            await self.ensure(name)
        self.scenarios.on_created.append(self.ensure)

    async def ensure(self, scenario: str) -> None:
        """Start the learner of a scenario (weights or harness) if its recipe learns and none runs yet."""
        chain = self.state.chain(scenario)
        if scenario in self.learners or scenario in self.idle:
            return
        if chain.binding["recipe"] == SKILLS:
            self._ensure_harness(scenario)
            return
        if chain.binding["recipe"] != SAO:
            return
        reason = self._can_train()
        if reason:
            self.idle[scenario] = reason
            log.info("no learner", extra={"reef": {"event": "learner_idle", "scenario": scenario, "recipe": SAO,
                                                    "reason": reason}})
            return
        if self.worker is None:
            threads = self.config.train_threads or max(1, (os.cpu_count() or 2) // 2)  # the other half of the cores
            self.worker = TrainingWorker(Path(getattr(self.runtime, "model_dir")), threads=threads)
            await self.worker.start()
            self._gate = WeightsGate(self.config.gate, self.runtime, self.worker)
        assert self._gate is not None
        publisher = CandidatePublisher(chain, self._gate, self.scenarios.serve_release)
        gate = self.config.gate
        # held-out records feed only the offline check; with evaluation tasks every record trains
        recipe = SAORecipe(self.config.sao, holdout_fraction=0.0 if gate.tasks else gate.holdout_fraction)
        learner = WeightsLearner(chain, self.state.store, recipe, self.worker, _logged(chain, SAO, publisher.decide),
                                 publisher.head_files, poll_interval=self.config.poll_interval)
        self.learners[scenario] = learner
        self.tasks[scenario] = asyncio.get_running_loop().create_task(learner.run(), name=f"learner:{scenario}")
        log.info("learner started", extra={"reef": {"event": "learner_started", "scenario": scenario, "recipe": SAO}})

    def _ensure_harness(self, scenario: str) -> None:
        if not self.config.enabled:
            self.idle[scenario] = "learning is disabled (learner.enabled: false)"
            log.info("no learner", extra={"reef": {"event": "learner_idle", "scenario": scenario, "recipe": SKILLS,
                                                    "reason": self.idle[scenario]}})
            return
        skills, chain = self.config.skills, self.state.chain(scenario)
        try:
            if self._harness_gate is None:
                self._harness_gate = HarnessGate(skills.gate, self.runtime)
            proposer = build_proposer(skills, self.runtime)
        except InvalidInput as exc:
            self.idle[scenario] = f"the skills recipe cannot start: {exc}"
            log.error("scenario %s: %s", scenario, self.idle[scenario])
            return
        publisher = HarnessPublisher(chain, self._harness_gate, CandidatePublisher(chain, None, self.scenarios.serve_release),
                                     self.scenarios.admit, skills.gate.publish)
        # held-out records serve the gate only when it has no task file
        recipe = SkillsRecipe(skills, proposer, holdout_fraction=0.0 if skills.gate.tasks else skills.gate.holdout_fraction)
        learner = HarnessLearner(chain, self.state.store, recipe, _logged(chain, SKILLS, publisher.decide),
                                 publisher.head_harness, poll_interval=self.config.poll_interval)
        self.learners[scenario] = learner
        self.tasks[scenario] = asyncio.get_running_loop().create_task(learner.run(), name=f"harness-learner:{scenario}")
        log.info("learner started", extra={"reef": {"event": "learner_started", "scenario": scenario, "recipe": SKILLS,
                                                     "proposer": skills.proposer}})

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        for learner in self.learners.values():
            if isinstance(learner, HarnessLearner):
                await learner.recipe.proposer.close()
        if self._harness_gate is not None:
            await self._harness_gate.close()
        if self.worker is not None:
            await self.worker.close()

    def status(self) -> dict[str, Any]:
        return {"learners": [learner.status() for learner in self.learners.values()],
                "idle": [{"scenario": s, "reason": r} for s, r in self.idle.items()],
                "training_queue": self.worker.pending() if self.worker else {}}


def _logged(chain: Any, recipe: str, decide: Callable[[Any], Awaitable[Verdict]]) -> Callable[[Any], Awaitable[Verdict]]:
    """The publisher's `decide` (gate, then publish or reject), with one info line per candidate:
    the decision, the gate's numeric metrics (never a task's prompt or answer), the chain's head
    after it (the new release when published) and how long it took."""

    async def decide_and_log(candidate: Any) -> Verdict:
        started = time.monotonic()
        fields: dict[str, Any] = {"event": "gate", "scenario": chain.scenario, "recipe": recipe,
                                  "batch_id": getattr(candidate, "batch_id", None)}
        try:
            verdict = await decide(candidate)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("gate failed", extra={"reef": {**fields, "error": type(exc).__name__,
                                                        "seconds": round(time.monotonic() - started, 3)}})
            raise
        numbers = {f"gate_{k}": v for k, v in verdict.metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        seconds = round(time.monotonic() - started, 3)
        log.info("gate verdict", extra={"reef": {**fields, "decision": verdict.decision, **numbers,
                                                  "head_release_id": chain.head().release_id, "seconds": seconds}})
        return verdict

    return decide_and_log
