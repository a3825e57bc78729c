"""SAO: single-rollout asynchronous policy optimisation, on a LoRA adapter.

Each scored record is one sample as soon as its report arrives: no sibling groups, no barrier.
Its advantage is the score minus a running baseline (an exponential moving average kept in the
commit log's algorithm state, so a restart resumes it). `batch_size` samples make one
optimiser step of a token-level policy-gradient loss with importance ratios against the
recorded rollout log-probs (tokens outside `(1 - eps_clip, 1 + eps_clip_high)` masked out;
optional KL penalty to the base model: `reef/grow/trainer.py`); `steps_per_candidate` steps
make one candidate for the gate.

A record is a sample only if it can be trained on honestly: complete, with token ids, log-probs
and the prompt's token ids, its spans verified against the release it was frozen to
(invariant 2), produced by a release at most `max_staleness` publications old, and not trained
on before. Every dropped record is counted by reason. A fixed hash-chosen fraction of records is
held out of training for the gate's offline check.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from reef.config import SAOConfig
from reef.core.provenance import verified
from reef.core.types import Record, RecordStatus, ReportedRecords
from reef.core.training import Sample, TrainConfig

NAME = "sao"


@dataclass
class ScoredSample:
    """A trainable sample with where it came from (for the batch log and compaction)."""

    record_id: str
    report_id: str
    report_seq: int
    score: float
    sample: Sample


@dataclass
class Intake:
    """What one pass over new reports yielded."""

    samples: list[ScoredSample] = field(default_factory=list)
    held_out: list[ScoredSample] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)


class SAORecipe:
    name = NAME

    def __init__(self, config: SAOConfig, holdout_fraction: float = 0.2) -> None:
        self.config = config
        self.holdout_fraction = holdout_fraction

    def train_config(self) -> TrainConfig:
        c = self.config
        return TrainConfig(lora_r=c.lora_r, lora_alpha=c.lora_alpha, lr=c.lr, warmup_steps=c.warmup_steps, eps_clip=c.eps_clip,
                           eps_clip_high=c.eps_clip_high, kl_coef=c.kl_coef, micro_batch=c.batch_size)

    @property
    def candidate_size(self) -> int:
        return self.config.batch_size * self.config.steps_per_candidate

    # -- intake --------------------------------------------------------------------------------

    def intake(self, items: list[ReportedRecords], staleness_of: Any, consumed: set[str]) -> Intake:
        """Turn newly reported records into samples. `staleness_of(release_id)` says how many
        releases were published after it (None if unknown to the chain)."""
        out = Intake()
        for item in items:
            missing = len(item.report.references) - len(item.records)
            if missing:
                out.dropped["compacted_or_missing"] += missing
            for record in item.records:
                reason = self._ineligible(record, staleness_of, consumed)
                if reason:
                    out.dropped[reason] += 1
                    continue
                scored = ScoredSample(record.id, item.report.id, item.cursor, item.report.score, sample_of(record))
                (out.held_out if self._held_out(record.id) else out.samples).append(scored)
        return out

    def _ineligible(self, record: Record, staleness_of: Any, consumed: set[str]) -> str | None:
        if record.id in consumed:
            return "already_trained"
        if record.status is not RecordStatus.COMPLETE:
            return "not_complete"
        response = record.response or {}
        if not record.token_ids or not record.logprobs or not response.get("prompt_token_ids"):
            return "no_tokens"
        if record.release is None or not verified(record):
            return "unverified"
        if record.request.get("top_p") not in (None, 1, 1.0):
            return "top_p"  # its log-probs are of a trimmed distribution the trainer does not reproduce
        staleness = staleness_of(record.release.release_id)
        if staleness is None:
            return "unknown_release"
        if staleness > self.config.max_staleness:
            return "stale"
        return None

    def sample_of(self, record: Record) -> Sample:
        return sample_of(record)

    def _held_out(self, record_id: str) -> bool:
        digest = hashlib.sha256(record_id.encode()).digest()
        return int.from_bytes(digest[:4], "big") / 2**32 < self.holdout_fraction

    # -- advantages ------------------------------------------------------------------------------

    def with_advantages(self, batch: list[ScoredSample], state: dict[str, Any] | None) -> tuple[list[Sample], dict[str, Any]]:
        """Advantage = score - running baseline, the baseline updated sample by sample."""
        state = dict(state or {})
        baseline = state.get("baseline")
        if baseline is None:
            baseline = sum(s.score for s in batch) / len(batch)
        decay = self.config.baseline_decay
        samples = []
        for item in batch:
            samples.append(Sample(item.sample.prompt_ids, item.sample.completion_ids, item.sample.rollout_logprobs,
                                  advantage=item.score - baseline, temperature=item.sample.temperature))
            baseline = decay * baseline + (1 - decay) * item.score
        state.update(baseline=baseline, samples_seen=int(state.get("samples_seen", 0)) + len(batch),
                     candidates=int(state.get("candidates", 0)) + 1)
        return samples, state


def sample_of(record: Record) -> Sample:
    """The training sample a record holds (its advantage is set later)."""
    response = record.response or {}
    temperature = record.request.get("temperature")
    return Sample(prompt_ids=list(response["prompt_token_ids"]), completion_ids=list(record.token_ids or []),
                  rollout_logprobs=list(record.logprobs or []), advantage=0.0,
                  temperature=1.0 if temperature in (None, 0) else float(temperature))
