"""From a candidate harness tree to a served release: the harness gate, then the shared publisher.

The candidate's files are the head's files with the harness replaced (weights kept), so one
artifact can hold both. The gate judges it on the scenario's serving load, pinned for the
evaluation so no swap unloads it meanwhile. With `publish: review` a selected candidate becomes
a pending release (verdict `review`) that `POST /reef/scenarios/{s}/promote` serves later.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncContextManager, Callable

from reef.commit.harness_gate import HarnessGate
from reef.commit.publisher import CandidatePublisher
from reef.commit.release_chain import Candidate, ReleaseChain
from reef.core.types import Release, ReleaseRef, Verdict
from reef.grow.harness_learner import HarnessCandidate
from reef.recipes.skills import NAME
from reef.surfaces.harness import HarnessTree, artifact_kind, merge_files

Admit = Callable[[str], AsyncContextManager[ReleaseRef]]


class HarnessPublisher:
    def __init__(self, chain: ReleaseChain, gate: HarnessGate, publisher: CandidatePublisher, admit: Admit,
                 publish: str = "auto") -> None:
        self.chain = chain
        self.gate = gate
        self.publisher = publisher
        self.admit = admit
        self.publish = publish
        self._head: tuple[Release, dict[str, bytes], HarnessTree] | None = None

    async def head_harness(self) -> tuple[Release, dict[str, bytes], HarnessTree]:
        """The head release, its files and its tree (read once per head)."""
        head = self.chain.head()
        if self._head is None or self._head[0].release_id != head.release_id:
            files = await asyncio.to_thread(self.chain.artifacts.files, head.release_id)
            self._head = (head, files, HarnessTree.from_files(files))
        return self._head

    async def decide(self, candidate: HarnessCandidate) -> Verdict:
        async with self.admit(self.chain.scenario) as serving:
            verdict = await self.gate.judge_candidate(serving, candidate.base_tree, candidate.tree, candidate.held_out)
        if verdict.decision == "select" and self.publish == "review":
            verdict = Verdict("review", verdict.metrics)
        files = merge_files(candidate.base_files, candidate.tree)
        mutations = [m.to_json() for m in candidate.mutations]
        artifact = Candidate(files, artifact_kind(files), {"kind": "training", "batch_id": candidate.batch_id},
                             {"recipe": NAME, "mutations": mutations})
        metrics: dict[str, Any] = {"proposal": {**candidate.notes, "mutations": mutations}}
        return await self.publisher.settle(artifact, verdict, candidate.base.release_id, batch_id=candidate.batch_id,
                                           algorithm_state=candidate.algorithm_state,
                                           high_water=candidate.high_water, metrics=metrics)
