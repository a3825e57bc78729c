"""Two reports on one record (a client retrying a report without a `report_id`) reach the SAO
recipe as one sample, scored by the later report: a batch never trains on one record twice.
Within one report, duplicate references are collapsed where the report is accepted
(tests/test_hardening3_web.py)."""

from __future__ import annotations

import asyncio

from reef.core.types import Record, RecordStatus, ReleaseRef, Report, ReportedRecords, TokenSpan
from reef.grow.recipe import LearnerView
from reef.recipes.sao import SAOConfig, SAORecipe

RELEASE = ReleaseRef("rel-1", "content-1", "load-1")


def record(rid: str) -> Record:
    return Record(
        rid,
        "s",
        RELEASE,
        {"messages": []},
        status=RecordStatus.COMPLETE,
        response={"prompt_token_ids": [1, 2, 3]},
        token_ids=[7, 8],
        logprobs=[-0.5, -0.7],
        spans=[TokenSpan(0, 2, RELEASE.runtime_load_id)],
    )


def view() -> LearnerView:
    async def no_files() -> dict[str, bytes]:
        return {}

    return LearnerView("s", set(), lambda release_id: 0, lambda: None, no_files)  # type: ignore[arg-type,return-value]


def reported(report_id: str, seq: int, score: float, *records: Record) -> ReportedRecords:
    report = Report(report_id, "s", tuple(r.id for r in records), score, seq=seq)
    return ReportedRecords(report, records)


def test_two_reports_on_one_record_make_one_sample_scored_by_the_later() -> None:
    recipe, seen = SAORecipe(SAOConfig(batch_size=2, steps_per_candidate=1)), view()
    a, b = record("rec-a"), record("rec-b")
    recipe.intake([reported("rep-1", 1, 0.0, a)], seen)
    recipe.intake([reported("rep-2", 2, 1.0, a), reported("rep-3", 3, 0.5, b)], seen)
    batch = asyncio.run(recipe.next_batch(seen))
    assert batch is not None
    assert sorted(batch.record_ids) == ["rec-a", "rec-b"]
    assert {s.record_id: s.score for s in batch.items} == {"rec-a": 1.0, "rec-b": 0.5}
    assert seen.dropped["rescored"] == 1


def test_a_record_named_by_many_reports_fills_no_batch_alone() -> None:
    recipe, seen = SAORecipe(SAOConfig(batch_size=4, steps_per_candidate=1)), view()
    a = record("rec-a")
    recipe.intake([reported(f"rep-{i}", i, float(i % 2), a) for i in range(1, 17)], seen)
    assert asyncio.run(recipe.next_batch(seen)) is None
    assert [s.record_id for s in recipe.pending] == ["rec-a"]
