"""A served record as a rollout to train on: whether it can be, honestly, and its `Rollout`.

A record is a rollout only if it was served here (an imported one, `POST /reef/records/batch`,
has no tokens of a release), is complete, has its token ids, log-probs and prompt token ids,
every token is covered by spans of the release it was frozen to (invariant 2), it was
sampled without top-p (its log-probs would be of a trimmed distribution the trainer does not
reproduce), it has not been learned from, and its release is known to the chain and at most
`max_staleness` publications old.
"""

from __future__ import annotations

from dataclasses import dataclass

from reef.core.provenance import verified
from reef.core.training import Rollout
from reef.core.types import Record, RecordStatus
from reef.grow.recipe import LearnerView


@dataclass(frozen=True)
class ScoredRollout:
    """A trainable rollout with the report that scored it (for the batch log)."""

    report_id: str
    report_seq: int
    score: float
    rollout: Rollout

    @property
    def record_id(self) -> str:
        return self.rollout.record_id


def rollout_problem(record: Record, consumed: set[str]) -> str | None:
    """Why `record` is no rollout to train on (a drop reason), or None."""
    if record.id in consumed:
        return "already_trained"
    if record.imported:  # served elsewhere: no tokens or log-probs of a release to train on
        return "imported"
    if record.status is not RecordStatus.COMPLETE:
        return "not_complete"
    response = record.response or {}
    if not record.token_ids or not record.logprobs or not response.get("prompt_token_ids"):
        return "no_tokens"
    if record.release is None or not verified(record):
        return "unverified"
    if record.request.get("top_p") not in (None, 1, 1.0):
        return "top_p"
    return None


def staleness_problem(release_id: str, view: LearnerView, max_staleness: int) -> str | None:
    """Why rollouts of `release_id` are too far off the policy being trained, or None."""
    staleness = view.staleness_of(release_id)
    if staleness is None:
        return "unknown_release"
    if staleness > max_staleness:
        return "stale"
    return None


def rollout_of(record: Record) -> Rollout:
    """The rollout a served record holds, made once: recipes keep it until it becomes a `Datum`."""
    if record.release is None:
        raise ValueError(f"record {record.id} names no release: it is no rollout")
    response = record.response or {}
    temperature = record.request.get("temperature")
    return Rollout(
        record_id=record.id,
        release_id=record.release.release_id,
        prompt_ids=list(response["prompt_token_ids"]),
        completion_ids=list(record.token_ids or []),
        behaviour_logprobs=list(record.logprobs or []),
        temperature=1.0 if temperature in (None, 0) else float(temperature),
    )
