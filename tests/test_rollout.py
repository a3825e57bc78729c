"""One shape from record to training row: `rollout_of` makes a record's `Rollout` once, and it
becomes a `Datum` only through `Rollout.datum`, with one advantage for every token or one each."""

from __future__ import annotations

import pytest

from reef.core.training import Datum, Rollout
from reef.core.types import Record, RecordStatus, ReleaseRef
from reef.grow.rollouts import ScoredRollout, rollout_of


def served(temperature: float | None, release: ReleaseRef | None = ReleaseRef("rel-1", "content-1")) -> Record:
    request = {"messages": [{"role": "user", "content": "hi"}]}
    if temperature is not None:
        request["temperature"] = temperature  # type: ignore[assignment]
    return Record(
        "rec-1",
        "alpha",
        release,
        request,
        RecordStatus.COMPLETE,
        response={"prompt_token_ids": [1, 2, 3]},
        token_ids=[4, 5],
        logprobs=[-0.5, -1.5],
    )


def test_a_record_is_one_rollout_that_names_its_record_and_release() -> None:
    rollout = rollout_of(served(0.7))
    assert rollout == Rollout("rec-1", "rel-1", [1, 2, 3], [4, 5], [-0.5, -1.5], 0.7)
    assert rollout_of(served(0)).temperature == 1.0 and rollout_of(served(None)).temperature == 1.0


def test_a_rollout_becomes_a_datum_with_one_advantage_or_one_per_token() -> None:
    rollout = rollout_of(served(0.7))
    one = rollout.datum(0.25)
    assert one == Datum([1, 2, 3], [4, 5], [-0.5, -1.5], [0.25, 0.25], [1.0, 1.0], 0.7)
    assert rollout.datum([0.5, -1.0]).advantages == [0.5, -1.0]
    one.check("cispo")  # a well-formed training row


def test_a_holder_keeps_the_rollout_itself() -> None:
    rollout = rollout_of(served(1.0))
    scored = ScoredRollout("report-1", 7, 0.9, rollout)
    assert scored.rollout is rollout and scored.record_id == "rec-1"


def test_a_record_without_a_release_is_no_rollout() -> None:
    with pytest.raises(ValueError, match="names no release"):
        rollout_of(served(1.0, release=None))
