"""Training instructions: an operator's words ("stop apologising; answer in one line") as a
learning signal (`POST /reef/train`).

An instruction is stored like any experience, so it gets a receipt and survives restarts: one
`complete` record tagged `reef.kind: instruction` (its request holds the instruction and the
receipts it refers to) with one report on it, whose sequence puts it in the learner's stream of
reports. A recipe that takes instructions (`takes_instructions`) recognises it there
(`instruction_in`); every other recipe is refused one before anything is stored. Its progress
is read from the commit log: `queued` until a logged batch names it, then `candidate` (being made
and judged), `judged` (selected and held for review), `published` (with the release) or
`rejected` (the gate refused it, or the batch was abandoned, with the reason).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

from reef.core.types import JSON, CommitEntry, Operation, Record, RecordStatus, Report, ReportedRecords

KIND_TAG = "reef.kind"
INSTRUCTION = "instruction"
MAX_INSTRUCTION_CHARS = 4000


@dataclass(frozen=True)
class Instruction:
    id: str
    report_id: str
    report_seq: int
    text: str
    references: tuple[str, ...]


def takes_instructions(recipe: Any) -> bool:
    """Whether a recipe (class or instance) learns from instructions."""
    return callable(getattr(recipe, "instruct", None))


def instruction_items(
    scenario: str, instruction_id: str, text: str, references: Sequence[str]
) -> tuple[Record, Report]:
    """The record and the report that store one instruction."""
    record = Record(
        id=instruction_id,
        scenario=scenario,
        release=None,
        request={INSTRUCTION: text, "references": list(references)},
        status=RecordStatus.COMPLETE,
        tags={KIND_TAG: INSTRUCTION},
    )
    report = Report(
        id=f"{INSTRUCTION}-{hashlib.sha256(instruction_id.encode()).hexdigest()[:40]}",
        scenario=scenario,
        references=(instruction_id,),
        score=0.0,
        feedback=text,
        metadata={KIND_TAG: INSTRUCTION},
    )
    return record, report


def is_instruction(record: Record) -> bool:
    return record.tags.get(KIND_TAG) == INSTRUCTION


def instruction_in(item: ReportedRecords) -> Instruction | None:
    """The instruction a reported item carries, if it is one."""
    if item.report.metadata.get(KIND_TAG) != INSTRUCTION or len(item.records) != 1:
        return None
    record = item.records[0]
    if not is_instruction(record):
        return None
    refs = record.request.get("references") or ()
    return Instruction(record.id, item.report.id, item.cursor, str(record.request.get(INSTRUCTION, "")), tuple(refs))


def instruction_progress(history: Sequence[CommitEntry], instruction_id: str) -> JSON:
    """Where an instruction stands, from the scenario's commit log."""
    batch_id: str | None = None
    for entry in history:
        if batch_id is None:
            if entry.operation is Operation.BATCH and entry.batch and instruction_id in entry.batch["record_ids"]:
                batch_id = entry.batch["batch_id"]
            continue
        if entry.metrics.get("batch_id") != batch_id:
            continue
        verdict = entry.verdict.to_json() if entry.verdict else None
        if entry.operation is Operation.TRAINING:
            release_id = promoted(history, entry) if entry.pending else entry.release.release_id
            state = "published" if release_id else "judged"
            return {"state": state, "batch_id": batch_id, "release_id": release_id or None, "verdict": verdict}
        if entry.operation is Operation.REJECTION:
            return {"state": "rejected", "batch_id": batch_id, "release_id": None, "verdict": verdict}
        if entry.operation is Operation.ABANDON:
            reason = entry.metrics.get("reason")
            return {"state": "rejected", "batch_id": batch_id, "release_id": None, "reason": reason}
    if batch_id is not None:
        return {"state": "candidate", "batch_id": batch_id, "release_id": None}
    return {"state": "queued", "batch_id": None, "release_id": None}


def promoted(history: Sequence[CommitEntry], pending: CommitEntry) -> str:
    """The release that published a candidate held for review ('' while it waits)."""
    for entry in history:
        if entry.operation is Operation.PROMOTE and entry.rollback_target_release_id == pending.release.release_id:
            return entry.release.release_id
    return ""
