"""A scenario's run-time settings as its commit log holds them: the training mode, the live
learner settings an operator changed, instructions and train-now requests.

Each change is one step of the scenario's log (`ReleaseChain.note`: operations `settings`,
`instruction`, `train_now`), so it survives a restart, every front end sharing the log sees it,
and the chain's history shows it. The revision is the step of the last `settings` step (0: never
changed), the ETag of `GET /reef/scenarios/{s}/config`; a change names the revision it was made
against, and a stale one is refused (`StaleRevision`) with nothing logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from reef.commit.release_chain import ReleaseChain
from reef.core.errors import RecordConflict, StaleHead
from reef.core.types import CommitEntry, Operation

TRAINING_MODES = ("auto", "manual", "hybrid")
RECENT_INSTRUCTIONS = 10


class StaleRevision(StaleHead):
    """The settings changed since the revision a caller read (HTTP 412)."""


@dataclass(frozen=True)
class LoggedInstruction:
    id: str
    step: int
    text: str
    references: tuple[str, ...]
    recorded_at: float


@dataclass(frozen=True)
class ScenarioSettings:
    revision: int
    training_mode: str
    live: dict[str, Any]  # live learner settings changed at run time, by name (the latest value of each)
    train_now: int  # the step of a train-now request no batch has answered yet (0: none)
    instructions: tuple[LoggedInstruction, ...]

    @classmethod
    def of(cls, entries: Sequence[CommitEntry]) -> ScenarioSettings:
        revision, mode, live = 0, "auto", {}
        train_now = 0
        instructions: list[LoggedInstruction] = []
        for entry in entries:
            if entry.operation is Operation.SETTINGS:
                revision = entry.step
                changes = dict(entry.metrics.get("settings") or {})
                mode = changes.pop("training_mode", mode)
                live.update(changes)
            elif entry.operation is Operation.TRAIN_NOW:
                train_now = entry.step
            elif entry.operation is Operation.BATCH:
                train_now = 0
            elif entry.operation is Operation.INSTRUCTION:
                instructions.append(instruction_of(entry))
        return cls(revision, mode, live, train_now, tuple(instructions))

    def etag(self) -> str:
        return f'"{self.revision}"'


def instruction_of(entry: CommitEntry) -> LoggedInstruction:
    m = entry.metrics
    return LoggedInstruction(
        str(m["instruction_id"]), entry.step, str(m["instruction"]), tuple(m.get("references") or ()), entry.recorded_at
    )


def settings_of(chain: ReleaseChain) -> ScenarioSettings:
    return ScenarioSettings.of(chain.history())


def change_settings(chain: ReleaseChain, changes: dict[str, Any], expected_revision: int | None) -> ScenarioSettings:
    """Log `changes` (`training_mode` and live settings, already checked) as one `settings` step;
    with `expected_revision`, only if the settings are still at that revision."""

    def check(entries: list[CommitEntry]) -> None:
        current = ScenarioSettings.of(entries).revision
        if expected_revision is not None and current != expected_revision:
            raise StaleRevision(
                f"scenario {chain.scenario!r}: the settings are at revision {current}, not {expected_revision}; "
                "read them again (GET .../config) and retry with the new ETag"
            )

    chain.note(Operation.SETTINGS, {"settings": dict(changes)}, check)
    return settings_of(chain)


def request_train_now(chain: ReleaseChain) -> CommitEntry:
    """Log an operator's request for the next batch; it is answered by the next batch the log shows."""
    return chain.note(Operation.TRAIN_NOW, {"requested": True})


class _Logged(Exception):
    def __init__(self, entry: CommitEntry) -> None:
        self.entry = entry


def log_instruction(
    chain: ReleaseChain, instruction_id: str, text: str, references: Sequence[str]
) -> LoggedInstruction:
    """Log an instruction once: a retry with the same content returns the logged one, other
    content under the same id is a `RecordConflict`."""
    wanted = {"instruction_id": instruction_id, "instruction": text, "references": list(references)}

    def check(entries: list[CommitEntry]) -> None:
        for entry in entries:
            if entry.operation is Operation.INSTRUCTION and entry.metrics.get("instruction_id") == instruction_id:
                if entry.metrics != wanted:
                    raise RecordConflict(f"instruction {instruction_id} was given with other content")
                raise _Logged(entry)

    try:
        return instruction_of(chain.note(Operation.INSTRUCTION, wanted, check))
    except _Logged as done:
        return instruction_of(done.entry)
