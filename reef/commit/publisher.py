"""From a trained adapter to a served release: the gate decides, the chain records, the runtime swaps.

A selected candidate is committed to the artifact store and published on the head by
compare-and-swap, then loaded under a new runtime_load_id and made the serving release (new
requests get it; requests in flight finish on theirs; the old load is unloaded once unpinned).
A rejected one is logged with its verdict and never served; one the gate sends to `review` is
published pending and served only once promoted. Each closes the learner's batch. `settle` is
shared by the weights and the harness learners.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from reef.core.canonical import content_id_of
from reef.commit.gate import WeightsGate
from reef.commit.release_chain import Candidate, ReleaseChain
from reef.core.types import Release, Verdict
from reef.grow.learner import TrainedCandidate
from reef.surfaces.harness import PREFIX as HARNESS_PREFIX, artifact_kind

Serve = Callable[[ReleaseChain, Release], Awaitable[Any]]


class CandidatePublisher:
    def __init__(self, chain: ReleaseChain, gate: WeightsGate | None, serve_release: Serve) -> None:
        self.chain = chain
        self.gate = gate
        self.serve_release = serve_release

    async def head_files(self) -> dict[str, bytes]:
        return await asyncio.to_thread(self.chain.artifacts.files, self.chain.head().release_id)

    async def decide(self, candidate: TrainedCandidate) -> Verdict:
        assert self.gate is not None
        head, serving = self.chain.head(), self.chain.serving()
        content_id = content_id_of(candidate.files)
        head_files = await self.head_files()
        verdict = await self.gate.judge(serving, head_files, content_id, candidate.files, candidate.holdout)
        # the head's harness (a seeded one) stays with the new weights
        files = {**candidate.files, **{p: d for p, d in head_files.items() if p.startswith(HARNESS_PREFIX)}}
        artifact = Candidate(files, artifact_kind(files), {"kind": "training", "batch_id": candidate.batch_id},
                             {"recipe": "sao"})
        return await self.settle(artifact, verdict, head.release_id, batch_id=candidate.batch_id,
                                 algorithm_state=candidate.algorithm_state,
                                 # the next batch may already be logged with a later cursor: never go back
                                 high_water=max(candidate.high_water, self.chain.high_water()),
                                 metrics={"training": candidate.metrics})

    async def settle(self, artifact: Candidate, verdict: Verdict, judged_head: str, *, batch_id: str,
                     algorithm_state: Any, high_water: int, metrics: dict[str, Any]) -> Verdict:
        """Log a candidate judged against `judged_head` (StaleHead if the head moved since):
        rejected, published and served (`select`), or published pending review (`review`,
        served only once promoted)."""
        common = dict(batch_id=batch_id, algorithm_state=algorithm_state, high_water=high_water, metrics=metrics)
        if verdict.decision == "reject":
            await asyncio.to_thread(self.chain.reject, artifact.content_id, judged_head, verdict=verdict, **common)
            return verdict
        release = await asyncio.to_thread(self.chain.publish, artifact, judged_head, verdict=verdict, **common)
        if not release.pending:
            await self.serve_release(self.chain, release)
        return verdict
