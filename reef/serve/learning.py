"""Learning beside serving: one learner per scenario, whatever its recipe.

The scenario's bound recipe (a name or dotted path, `reef.config.find_recipe`) says which
surface it learns; this file only builds what that surface needs and starts the generic
learner (`reef.grow.learner`, which feeds its gate's lane, `reef.commit.gate_lane`, and its
canary loop, `reef.grow.canary`). Learners run as tasks on the server's event loop. Weights
recipes share one training process, which serves their jobs round-robin, so several scenarios
train at once without one starving another; a scenario whose recipe needs weights but whose
runtime cannot load them (an upstream provider) is listed with the reason instead of a learner.
A harness recipe gets a learner on any runtime (upstream or embedded): it needs no training
process, only the runtime to answer the gate's tasks (and, by default, the LLM proposer's prompt).

With leases (several front ends on one PostgreSQL database, `reef.commit.leases`), a scenario's
learner runs on one front end only: the one holding its lease. Every front end wants every
scenario its configuration lets it learn; every second each tries to take the leases nobody
holds and checks the ones it holds. A front end that loses a lease (its database connection
dropped) stops that learner at once; the one that takes it builds a fresh learner from the
commit log, which resumes the batches the log shows open (abandoning, logged, only one whose
records are gone from the experience store).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol

from reef.commit.gate import WeightsGate
from reef.commit.gate_lane import Decide, GateLane, Warm
from reef.commit.harness_gate import HarnessGate
from reef.commit.harness_publisher import HarnessPublisher
from reef.commit.publisher import CandidatePublisher
from reef.commit.release_chain import ReleaseChain
from reef.commit.state import ReefState
from reef.config import LearnerConfig, find_recipe
from reef.core.errors import InvalidInput
from reef.core.learned import LearnedCandidate
from reef.core.types import Verdict
from reef.grow.canary import CanaryLoop, CanaryServing
from reef.grow.chain_view import HeadFiles
from reef.grow.learner import ANSWER_AHEAD_AFTER_S, Learner
from reef.grow.learner_stats import LearnerStats
from reef.grow.rank_launch import RankLayout
from reef.grow.recipe import Recipe, RecipeContext
from reef.grow.training_client import TrainingClient
from reef.grow.worker import TrainingFailed, TrainingWorker
from reef.observe import spans
from reef.observe.store import ExperienceStore
from reef.runtimes.base import Runtime
from reef.serve.canary import ScenarioCanary
from reef.serve.scenarios import ScenarioDirectory

log = logging.getLogger("reef.learning")
LEASE_INTERVAL_S = 1.0  # how often a front end checks its leases and tries to take the free ones


class Leases(Protocol):  # reef.commit.leases.PgLeases
    kind: str
    holder: str

    def keep(self) -> set[str]: ...
    def try_take(self, scenario: str) -> bool: ...
    def release(self, scenario: str) -> None: ...
    def holders(self, scenarios: list[str]) -> dict[str, str | None]: ...
    def close(self) -> None: ...


class Learning:
    def __init__(
        self,
        config: LearnerConfig,
        state: ReefState,
        runtime: Runtime,
        scenarios: ScenarioDirectory,
        leases: Leases | None = None,
        front_end: str | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self.runtime = runtime
        self.scenarios = scenarios
        self.learners: dict[str, Learner] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.idle: dict[str, str] = {}  # scenario -> why it has no learner
        self.worker: TrainingWorker | None = None
        self._gate: WeightsGate | None = None
        self._harness_gates: dict[str, HarnessGate] = {}  # by recipe
        self.leases = leases
        self.front_end = front_end
        self.wanted: set[str] = set()  # with leases: scenarios this front end would learn if it held the lease
        self.holders: dict[str, str | None] = {}  # scenario -> the front end holding its lease (last look)
        self.lease_error: str | None = None
        self._lease_task: asyncio.Task[None] | None = None

    def _can_train(self) -> str | None:
        if getattr(self.runtime, "model_dir", None) is None:
            return f"the {self.runtime.name} runtime cannot load trained weights"
        return None

    async def start(self) -> None:
        for name in self.state.scenarios():
            await self.ensure(name)
        self.scenarios.on_created.append(self.ensure)
        self.scenarios.on_archived.append(self.forget)
        if self.leases is not None:
            self._lease_task = asyncio.get_running_loop().create_task(self._keep_leases(), name="learner-leases")

    async def ensure(self, scenario: str) -> None:
        """Start the learner of a scenario if none runs yet (or say why it has none); with
        leases, only once this front end holds the scenario's lease."""
        if scenario in self.learners or scenario in self.idle or scenario in self.wanted:
            return
        chain = self.state.chain(scenario)
        name = chain.binding["recipe"]
        try:
            recipe_class = find_recipe(name)
        except InvalidInput as exc:  # bound by an earlier config that knew it
            self.idle[scenario] = str(exc)
            return
        if not self.config.enabled:
            self.idle[scenario] = "learning is disabled (learner.enabled: false)"
            log.info(
                "no learner",
                extra={
                    "reef": {
                        "event": "learner_idle",
                        "scenario": scenario,
                        "recipe": name,
                        "reason": self.idle[scenario],
                    }
                },
            )
            return
        reason = self._can_train() if recipe_class.surface == "weights" else None
        if reason:
            self.idle[scenario] = reason
            log.info(
                "no learner",
                extra={"reef": {"event": "learner_idle", "scenario": scenario, "recipe": name, "reason": reason}},
            )
            return
        if self.leases is not None:
            self.wanted.add(scenario)  # the lease loop starts it once this front end holds the lease
            return
        await self._start_learner(scenario)

    async def _start_learner(self, scenario: str) -> None:
        chain = self.state.chain(scenario)
        name = chain.binding["recipe"]
        recipe_class = find_recipe(name)
        try:
            recipe = recipe_class(self.config.settings_for(name), RecipeContext(self.runtime, self.config.gate))
            if recipe_class.surface == "weights":
                publisher: Any = await self._weights_publisher(chain)
                trainer = TrainingClient(self.worker, scenario) if self.worker else None
            else:
                publisher, trainer = self._harness_publisher(chain, name, recipe), None
        except (InvalidInput, TrainingFailed) as exc:  # a bad setting, or a trainer that cannot start here
            self.idle[scenario] = f"the {name} recipe cannot start: {exc}"
            log.error("scenario %s: %s", scenario, self.idle[scenario])
            return
        fraction = self.config.canary.get(scenario) if recipe_class.surface == "weights" else None
        learner = wire_learner(
            chain,
            self.state.store,
            recipe,
            _logged(chain, name, self._served(chain, publisher.decide)),
            publisher.head_files,
            trainer,
            canary=ScenarioCanary(self.scenarios, scenario, fraction) if fraction else None,
            gate_after=self.config.gate.after_batches,
            warm=publisher.warm if recipe_class.surface == "weights" else None,
            live_split=self.config.gate.live_split,
            poll_interval=self.config.poll_interval,
        )
        self.learners[scenario] = learner
        self.tasks[scenario] = asyncio.get_running_loop().create_task(learner.run(), name=f"learner:{scenario}")
        log.info(
            "learner started",
            extra={
                "reef": {
                    "event": "learner_started",
                    "scenario": scenario,
                    "recipe": name,
                    "surface": recipe_class.surface,
                }
            },
        )

    async def _stop_learner(self, scenario: str, reason: str) -> None:
        learner, task = self.learners.pop(scenario, None), self.tasks.pop(scenario, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if learner is not None:
            await learner.recipe.close()
            log.warning(
                "learner stopped", extra={"reef": {"event": "learner_stopped", "scenario": scenario, "reason": reason}}
            )

    async def forget(self, scenario: str) -> None:
        """The scenario is archived: stop its learner (its candidate in flight is dropped) and
        forget it, so a new scenario of the name gets a learner of its own. A lease on the name is
        kept: another front end that has not yet let go of the archived scenario cannot take it."""
        await self._stop_learner(scenario, "the scenario was archived")
        self.idle.pop(scenario, None)
        self.wanted.discard(scenario)

    async def _keep_leases(self) -> None:
        """Every LEASE_INTERVAL_S: stop the learners whose lease was lost, take the free leases
        of the scenarios this front end wants and start their learners, note who holds what."""
        assert self.leases is not None
        while True:
            try:
                await self.lease_round()
                self.lease_error = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database is down: tried again next round
                problem = f"{type(exc).__name__}: {exc}"
                if problem != self.lease_error:
                    log.warning("learner leases: %s", problem)
                self.lease_error = problem
                self.holders = {}
            await asyncio.sleep(LEASE_INTERVAL_S)

    async def lease_round(self) -> None:
        assert self.leases is not None
        held = await asyncio.to_thread(self.leases.keep)
        for scenario in list(self.learners):
            if scenario not in held:
                await self._stop_learner(
                    scenario, f"lost its lease ({self.leases.kind}: its connection or lock is gone)"
                )
            elif self.tasks[scenario].done():  # its loop ended (e.g. it could not read the log): start again
                await self._stop_learner(scenario, "its loop ended")
        for scenario in sorted(self.wanted - set(self.learners)):
            if scenario in self.idle:
                continue
            if await asyncio.to_thread(self.leases.try_take, scenario):
                log.info(
                    "learner lease taken",
                    extra={"reef": {"event": "lease_taken", "scenario": scenario, "front_end": self.leases.holder}},
                )
                await self._start_learner(scenario)
                if scenario in self.idle:  # its recipe cannot start here: let another front end try
                    await asyncio.to_thread(self.leases.release, scenario)
        self.holders = await asyncio.to_thread(self.leases.holders, sorted(self.wanted))

    async def _weights_publisher(self, chain: Any) -> CandidatePublisher:
        if self.worker is None:
            threads = self.config.train_threads or max(1, (os.cpu_count() or 2) // 2)  # the other half of the cores
            worker = TrainingWorker(
                Path(getattr(self.runtime, "model_dir")),
                threads=threads,
                device=self.config.device,
                dtype=self.config.dtype,
                engine_dtype=getattr(self.runtime, "engine_dtype", None),
                weights=self.config.weights,
                layout=RankLayout(self.config.ranks, self.config.nodes, self.config.rendezvous),
            )
            gate = WeightsGate(self.config.gate, self.runtime, worker)
            await gate.check_lengths()  # InvalidInput before the trainer starts
            await worker.start()  # TrainingFailed (e.g. learner.device: cuda without a GPU) leaves no worker
            self.worker, self._gate = worker, gate
        return CandidatePublisher(chain, self._gate, pin=self.scenarios.pin)

    def _served(self, chain: ReleaseChain, decide: Decide) -> Decide:
        """The publisher's `decide`, then, once it published a release as the head (`select`),
        this front end serves it, following the chain as it follows other front ends' heads."""

        async def decide_and_serve(candidate: LearnedCandidate) -> Verdict:
            verdict = await decide(candidate)
            if verdict.decision == "select":
                await self.scenarios.follow_head(chain)
            return verdict

        return decide_and_serve

    async def head_moved(self, scenario: str) -> None:
        """An operator moved the head (a rollback or promote, answered by this front end): the
        scenario's canary stops before the answer, and its learner drops the line trained from the
        head it replaced. (On another front end, its learner sees the head moved at its next step.)"""
        learner = self.learners.get(scenario)
        if learner is not None:
            await learner.head_moved()
        await self.scenarios.stop_canary(scenario)  # a canary with no learner here: none admitted from now

    def _harness_publisher(self, chain: Any, name: str, recipe: Any) -> HarnessPublisher:
        gate_config = recipe.harness_gate
        if name not in self._harness_gates:
            self._harness_gates[name] = HarnessGate(gate_config, self.runtime)
        return HarnessPublisher(
            chain,
            self._harness_gates[name],
            CandidatePublisher(chain, None),
            self.scenarios.admit,
            gate_config.publish,
        )

    async def close(self) -> None:
        if self._lease_task is not None:
            self._lease_task.cancel()
            await asyncio.gather(self._lease_task, return_exceptions=True)
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        if self.leases is not None:
            await asyncio.to_thread(self.leases.close)  # after the learners stopped: then the next may start
        for learner in self.learners.values():
            await learner.recipe.close()
        for gate in self._harness_gates.values():
            await gate.close()
        if self.worker is not None:
            await self.worker.close()

    def status(self) -> dict[str, Any]:
        leases = [
            {"scenario": s, "holder": self.holders.get(s), "held_here": s in self.learners}
            for s in sorted(self.wanted)
            if s not in self.idle
        ]
        return {
            "learners": [learner.status() for learner in self.learners.values()],
            "idle": [{"scenario": s, "reason": r} for s, r in self.idle.items()],
            "training_queue": self.worker.pending() if self.worker else {},
            "training_busy_s": {k: round(v, 1) for k, v in self.worker.busy_s.items()} if self.worker else {},
            "front_end": self.front_end,
            "lease_kind": self.leases.kind if self.leases else None,
            "leases": leases,
            "lease_error": self.lease_error,
        }


def wire_learner(
    chain: ReleaseChain,
    store: ExperienceStore,
    recipe: Recipe,
    decide: Decide,
    head_files: HeadFiles,
    trainer: TrainingClient | None = None,
    *,
    canary: CanaryServing | None = None,
    gate_after: int = 1,
    warm: Warm | None = None,
    live_split: float | None = None,
    poll_interval: float = 0.5,
    answer_ahead_after: float = ANSWER_AHEAD_AFTER_S,
) -> Learner:
    """A scenario's three loops, joined: the gate's lane (judging, `decide`), the canary loop
    (`canary` None: no canary), and the learner (intake and training) that feeds both."""
    stats = LearnerStats()
    scope = functools.partial(spans.batch_scope, chain.scenario, recipe.name)
    lane = GateLane(chain.scenario, decide, scope, gate_after=gate_after, warm=warm)
    canary_loop = CanaryLoop(chain.scenario, canary, live_split, stats)
    return Learner(
        chain,
        store,
        recipe,
        head_files,
        lane,
        canary_loop,
        stats,
        trainer,
        poll_interval=poll_interval,
        answer_ahead_after=answer_ahead_after,
    )


def _logged(
    chain: Any, recipe: str, decide: Callable[[Any], Awaitable[Verdict]]
) -> Callable[[Any], Awaitable[Verdict]]:
    """The publisher's `decide` (gate, then publish or reject), with one info line per candidate:
    the decision, the gate's numeric metrics (never a task's prompt or answer), the chain's head
    after it (the new release when published) and how long it took."""

    async def decide_and_log(candidate: Any) -> Verdict:
        started = time.monotonic()
        fields: dict[str, Any] = {
            "event": "gate",
            "scenario": chain.scenario,
            "recipe": recipe,
            "batch_id": getattr(candidate, "batch_id", None),
        }
        try:
            verdict = await decide(candidate)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "gate failed",
                extra={
                    "reef": {**fields, "error": type(exc).__name__, "seconds": round(time.monotonic() - started, 3)}
                },
            )
            raise
        numbers = {
            f"gate_{k}": v
            for k, v in verdict.metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        seconds = round(time.monotonic() - started, 3)
        log.info(
            "gate verdict",
            extra={
                "reef": {
                    **fields,
                    "decision": verdict.decision,
                    **numbers,
                    "head_release_id": chain.head().release_id,
                    "seconds": seconds,
                }
            },
        )
        return verdict

    return decide_and_log
