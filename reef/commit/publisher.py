"""From a learned candidate to a release on the chain: the gate decides, the chain records.

A selected candidate is committed to the artifact store and published on the head by
compare-and-swap; the server serves it by following the chain's head (`reef.serve.learning`, as
it follows the heads other front ends publish: loaded under a new runtime_load_id, new requests
get it, requests in flight finish on theirs). Publishing never calls into the server: the flow
goes one way, from the gate to the chain. A rejected candidate is logged with its verdict and
never served; one the gate sends to `review` is published pending and served only once promoted.
Each closes the learner's batch. `settle` is shared by the weights and the harness publishers;
neither knows which recipe made a candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AbstractContextManager
from typing import Any, Callable

from reef.commit.gate import WeightsGate
from reef.commit.release_chain import ReleaseChain
from reef.core.canonical import content_id_of
from reef.core.learned import LearnedCandidate
from reef.core.types import Candidate, Verdict
from reef.surfaces.harness import PREFIX as HARNESS_PREFIX
from reef.surfaces.harness import artifact_kind

Pin = Callable[[str | None], AbstractContextManager[Any]]  # keeps a runtime load loaded while held


def _no_pin(runtime_load_id: str | None) -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


class CandidatePublisher:
    def __init__(self, chain: ReleaseChain, gate: WeightsGate | None, pin: Pin = _no_pin) -> None:
        self.chain = chain
        self.gate = gate
        self.pin = pin  # the server's (`ScenarioDirectory.pin`): the gate's answers need the load they started on
        if gate is not None:
            gate.remember(chain.releases())  # which half selected each release, for `gate.halves`

    async def head_files(self) -> dict[str, bytes]:
        return await asyncio.to_thread(self.chain.artifacts.files, self.chain.head().release_id)

    async def decide(self, candidate: LearnedCandidate) -> Verdict:
        """Weights: judged against the head at judging time (it may have moved since the
        candidate started training: the adapter replaces the weights whatever they were)."""
        assert self.gate is not None
        head, serving = self.chain.head(), self.chain.serving()
        content_id = content_id_of(candidate.files)
        # pinned as it is read: a rollback or promote meanwhile swaps the serving release, and its
        # load then goes only once the verdict is in (which the moved head makes stale)
        with self.pin(serving.runtime_load_id):
            head_files = await self.head_files()
            verdict = await self.gate.judge(
                serving,
                head_files,
                content_id,
                candidate.files,
                candidate.held_out,
                starved=candidate.starved,
                live=candidate.live,
                # an operator's live margin or confidence (GET/POST /reef/scenarios/{s}/config); none: the config's
                **({"thresholds": candidate.gate_overrides} if candidate.gate_overrides else {}),
            )
        # the head's harness (a seeded one) stays with the new weights
        files = {**candidate.files, **{p: d for p, d in head_files.items() if p.startswith(HARNESS_PREFIX)}}
        return await self.settle(
            candidate,
            artifact(candidate, files),
            verdict,
            head.release_id,
            # the next batch may already be logged with a later cursor: never go back
            high_water=max(candidate.high_water, self.chain.high_water()),
        )

    async def warm(self, starved: bool = False) -> int:
        """Let the gate answer its tasks for the serving release ahead of the next candidate."""
        if self.gate is None:
            return 0
        serving = self.chain.serving()
        with self.pin(serving.runtime_load_id):
            return await self.gate.warm(serving, starved, files=self.head_files)

    async def settle(
        self, candidate: LearnedCandidate, artifact: Candidate, verdict: Verdict, judged_head: str, *, high_water: int
    ) -> Verdict:
        """Log a candidate judged against `judged_head` (StaleHead if the head moved since):
        rejected, published as the head (`select`), or published pending review (`review`,
        the head only once promoted)."""
        common = dict(
            batch_id=candidate.batch_id,
            algorithm_state=candidate.algorithm_state,
            high_water=high_water,
            metrics=candidate.metrics,
        )
        if verdict.decision == "reject":
            await asyncio.to_thread(self.chain.reject, artifact.content_id, judged_head, verdict=verdict, **common)
            return verdict
        await asyncio.to_thread(self.chain.publish, artifact, judged_head, verdict=verdict, **common)
        return verdict


def artifact(candidate: LearnedCandidate, files: dict[str, bytes]) -> Candidate:
    """The content to commit, with where it came from: the recipe and what it recorded."""
    return Candidate(
        files,
        artifact_kind(files),
        {"kind": "training", "batch_id": candidate.batch_id},
        {"recipe": candidate.recipe, **candidate.metadata},
    )
