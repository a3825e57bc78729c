"""Every candidate of a scenario as its commit log tells it: the batch it came from, its fate
(published, pending review, rejected, abandoned, or still open), the gate's numbers, the
training steps the learner logged with it, and whether live scores withdrew its canary.

Read from the log alone, so the counts survive a restart (the learner's own counters in
`GET /reef/status` start from zero with the process).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from reef.core.types import CommitEntry, Operation

FATES = ("published", "pending review", "rejected", "abandoned", "open")


def candidate_fates(history: Sequence[CommitEntry]) -> list[dict[str, Any]]:
    """One row per logged batch, oldest first."""
    rows: dict[str, dict[str, Any]] = {}
    promoted = {e.rollback_target_release_id for e in history if e.operation is Operation.PROMOTE}
    for entry in history:
        if entry.operation is Operation.BATCH and entry.batch:
            rows[entry.batch["batch_id"]] = _begun(entry)
            continue
        batch_id = entry.metrics.get("batch_id")
        if batch_id not in rows or entry.operation not in _CLOSING:
            continue
        rows[batch_id].update(_closed(entry, promoted))
    return list(rows.values())


def fate_counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many candidates met each fate, and how many canaries live scores withdrew."""
    counts = Counter(row["fate"] for row in rows)
    return {
        "batches": len(rows),
        **{fate.replace(" ", "_"): counts.get(fate, 0) for fate in FATES},
        "withdrawn": sum(1 for row in rows if row["withdrawn"]),
    }


_CLOSING = (Operation.TRAINING, Operation.REJECTION, Operation.ABANDON)


def _begun(entry: CommitEntry) -> dict[str, Any]:
    batch = entry.batch or {}
    return {
        "batch_id": batch["batch_id"],
        "batch_step": entry.step,
        "begun_at": entry.recorded_at,
        "from_release_id": batch.get("from_release_id"),
        "records": len(batch.get("record_ids") or ()),
        "report_ids": list(batch.get("report_ids") or ()),
        "fate": "open",
        "step": None,
        "decided_at": None,
        "release_id": None,
        "content_id": None,
        "verdict": None,
        "reason": None,
        "withdrawn": False,
        "steps": [],
        "training": None,
        "proposal": None,
    }


def _closed(entry: CommitEntry, promoted: set[str | None]) -> dict[str, Any]:
    metrics = entry.metrics
    verdict = entry.verdict.to_json() if entry.verdict else None
    if verdict is not None:
        per_task = verdict["metrics"].get("per_task") or []
        verdict = {**verdict, "metrics": {k: v for k, v in verdict["metrics"].items() if k != "per_task"}}
        verdict["metrics"]["tasks"] = len(per_task) or verdict["metrics"].get("n")
    published = entry.operation is Operation.TRAINING
    return {
        "fate": _fate(entry, promoted),
        "step": entry.step,
        "decided_at": entry.recorded_at,
        "release_id": entry.release.release_id if published else None,
        "content_id": entry.release.content_id if published else metrics.get("candidate_content_id"),
        "verdict": verdict,
        "reason": metrics.get("reason"),
        "withdrawn": bool((metrics.get("canary") or {}).get("withdrawn")),
        "steps": list(metrics.get("steps") or ()),
        "training": metrics.get("training"),
        "proposal": metrics.get("proposal"),
    }


def _fate(entry: CommitEntry, promoted: set[str | None]) -> str:
    if entry.operation is Operation.ABANDON:
        return "abandoned"
    if entry.operation is Operation.REJECTION:
        return "pending review" if entry.verdict and entry.verdict.decision == "review" else "rejected"
    if entry.pending and entry.release.release_id not in promoted:
        return "pending review"
    return "published"
