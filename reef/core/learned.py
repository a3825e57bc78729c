"""What a learner hands the gate and the publisher: one candidate a recipe made from one batch.

Plain data, so `commit` judges and publishes it without knowing which recipe made it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from reef.core.live_evidence import LiveEvidence
from reef.core.types import JSON


@dataclass(frozen=True)
class LearnedCandidate:
    scenario: str
    batch_id: str
    recipe: str  # recorded with the artifact; nothing downstream branches on it
    files: Mapping[str, bytes]  # weights: the checkpoint (adapter + optimiser); harness: the whole content
    base_release_id: str  # the head it was made from (a harness is judged against exactly that)
    base_files: Mapping[str, bytes]  # that head's content
    high_water: int  # the report cursor its batch was logged at
    metadata: JSON = field(default_factory=dict)  # stored in the artifact manifest (e.g. mutations)
    metrics: JSON = field(default_factory=dict)  # stored in the chain entry (training or proposal notes)
    algorithm_state: JSON = field(default_factory=dict)  # the recipe's state after this batch (e.g. a baseline)
    # what the gate evaluates on when it has no task file: (score, Rollout) pairs for weights,
    # task objects for a harness
    held_out: list[Any] = field(default_factory=list)
    # the learner waits for samples as the gate begins to judge this one: the gate may leave the
    # serving runtime to live traffic while it judges (`gate.concurrency_when: starved`)
    starved: bool = False
    # the live scores of its line and of the serving release, served side by side (`gate.live_split`)
    live: LiveEvidence | None = None
    # the gate's thresholds an operator changed live (`margin`, `confidence`), over its config's
    gate_overrides: JSON = field(default_factory=dict)
