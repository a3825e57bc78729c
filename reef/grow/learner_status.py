"""What a learner shows in `GET /reef/status` (`learning.learners[]`, docs/http.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reef.grow.learner import Learner


def learner_status(learner: Learner) -> dict[str, Any]:
    s = learner.stats
    out = {
        "scenario": learner.scenario,
        "recipe": learner.recipe.name,
        "surface": learner.recipe.surface,
        "state": s.state,
        "cursor": learner.cursor,
        **learner.recipe.status(),
        "batches": s.batches,
        "candidates": s.candidates,
        "published": s.published,
        "pending_review": s.review,
        "rejected": s.rejected,
        "abandoned": s.abandoned,
        "dropped": dict(s.dropped),
        "last_verdict": s.last_verdict,
        "last_error": s.last_error,
        "waiting_for_samples": None if learner.wait.fraction is None else round(learner.wait.fraction, 3),
        **learner.steering.status(),  # training mode, train-now, instructions
    }
    if learner.pipelined:
        out["batches_past_release"] = learner.line.made - learner.line.published
    if learner.canary.serving is not None:
        out["canary"] = learner.canary.summary()
    if learner.trainer is not None:
        out["training_queue"] = learner.trainer.worker.pending().get(learner.scenario, 0)
    return out
