"""From a candidate harness to a served release: the harness gate, then the shared publisher.

The candidate's files are the head's files with the harness replaced (weights kept), so one
artifact can hold both. The gate judges it against the head it was made from, on the scenario's
serving load, pinned for the evaluation so no swap unloads it meanwhile. With `publish: review`
a selected candidate becomes a pending release (verdict `review`) that
`POST /reef/scenarios/{s}/promote` serves later.
"""

from __future__ import annotations

from typing import AsyncContextManager, Callable

from reef.commit.harness_gate import HarnessGate
from reef.commit.publisher import CandidatePublisher, artifact
from reef.commit.release_chain import ReleaseChain
from reef.core.learned import LearnedCandidate
from reef.core.types import ReleaseRef, Verdict
from reef.surfaces.harness import HarnessTree

Admit = Callable[[str], AsyncContextManager[ReleaseRef]]


class HarnessPublisher:
    def __init__(
        self, chain: ReleaseChain, gate: HarnessGate, publisher: CandidatePublisher, admit: Admit, publish: str = "auto"
    ) -> None:
        self.chain = chain
        self.gate = gate
        self.publisher = publisher
        self.admit = admit
        self.publish = publish
        self.head_files = publisher.head_files

    async def decide(self, candidate: LearnedCandidate) -> Verdict:
        base, tree = HarnessTree.from_files(candidate.base_files), HarnessTree.from_files(candidate.files)
        async with self.admit(self.chain.scenario) as serving:
            margin = candidate.gate_overrides.get("margin")  # an operator's live change, over the config's
            verdict = await self.gate.judge_candidate(serving, base, tree, candidate.held_out, margin)
        if verdict.decision == "select" and self.publish == "review":
            verdict = Verdict("review", verdict.metrics)
        return await self.publisher.settle(
            candidate,
            artifact(candidate, dict(candidate.files)),
            verdict,
            candidate.base_release_id,
            high_water=candidate.high_water,
        )
