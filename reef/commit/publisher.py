"""From a trained adapter to a served release: the gate decides, the chain records, the runtime swaps.

A selected candidate is committed to the artifact store and published on the head by
compare-and-swap, then loaded under a new runtime_load_id and made the serving release (new
requests get it; requests in flight finish on theirs; the old load is unloaded once unpinned).
A rejected one is logged with its verdict and never served. Both close the learner's batch.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from reef.commit.artifacts import content_id_of
from reef.commit.gate import WeightsGate
from reef.commit.release_chain import Candidate, ReleaseChain
from reef.core.types import ArtifactKind, Release, Verdict
from reef.grow.learner import TrainedCandidate

Serve = Callable[[ReleaseChain, Release], Awaitable[Any]]


class CandidatePublisher:
    def __init__(self, chain: ReleaseChain, gate: WeightsGate, serve_release: Serve) -> None:
        self.chain = chain
        self.gate = gate
        self.serve_release = serve_release

    async def head_files(self) -> dict[str, bytes]:
        return await asyncio.to_thread(self.chain.artifacts.files, self.chain.head().release_id)

    async def decide(self, candidate: TrainedCandidate) -> Verdict:
        head = self.chain.head()
        serving = self.chain.serving()
        content_id = content_id_of(candidate.files)
        verdict = await self.gate.judge(serving, await self.head_files(), content_id, candidate.files,
                                        candidate.holdout)
        common = dict(batch_id=candidate.batch_id, algorithm_state=candidate.algorithm_state,
                      high_water=candidate.high_water, metrics={"training": candidate.metrics})
        if verdict.decision == "reject":
            await asyncio.to_thread(self.chain.reject, content_id, head.release_id, verdict=verdict, **common)
            return verdict
        artifact = Candidate(candidate.files, ArtifactKind.WEIGHTS,
                             {"kind": "training", "batch_id": candidate.batch_id}, {"recipe": "sao"})
        release = await asyncio.to_thread(self.chain.publish, artifact, head.release_id, verdict=verdict, **common)
        await self.serve_release(self.chain, release)
        return verdict
