"""A scenario's release chain, built on its commit log and the artifact store.

Every change is one commit-log step, appended while the log is held exclusively, after the
artifact (if any) is committed to git. So the log is the truth and the scenario's git ref is
only its mirror (repaired from the log on open, never the reverse). The chain does not know
which `CommitLog` it has (a JSONL file, or a table shared by front ends on PostgreSQL): holding
the log is what makes check-head, commit-artifact, append one compare-and-swap either way.

- `publish` adds a release on top of `expected_parent` (the head), or a pending one that
  waits for `promote` when the gate said `review`.
- `reject` logs a refused candidate; the head stays.
- `rollback` and `promote` republish existing content as a new release with the next step:
  history is never rewritten. Without an expected head they stack on the head of the moment.
- `advance` moves the *serving* pointer (the release new requests are frozen to, with the
  runtime load that serves it) by compare-and-swap, only forward along the chain. It is
  process state, not logged: after a restart the serving pointer starts at the head.
- `begin_batch` logs a learner's batch before training; it stays open until a `publish` or
  `reject` names it, or `abandon_batch` closes it. `open_batches` tells a restarted learner.
  A batch closes once (naming a closed one is a `Conflict`) and a record is in one batch at
  most, so two learners on one scenario (a lease changing hands) cannot train a batch twice.
- `compact` deletes consumed records from the experience store, logged first.
- `note` logs an operator's step that moves no release and closes no batch (a settings change,
  an instruction, a train-now request); a batch begun against the step before such notes is
  still logged, since they change nothing it depends on.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from reef.commit.artifacts import ArtifactManifest, ArtifactStore
from reef.commit.commit_log import CommitLog
from reef.core.errors import Conflict, InvalidInput, NotFound, StaleHead
from reef.core.types import (
    JSON,
    ArtifactKind,
    Candidate,
    CommitEntry,
    Operation,
    Release,
    ReleaseRef,
    Verdict,
)
from reef.observe.store import ExperienceStore


class ReleaseChain:
    def __init__(self, scenario: str, log: CommitLog, artifacts: ArtifactStore) -> None:
        self.scenario = scenario
        self.log = log
        self.artifacts = artifacts
        self._serving_lock = threading.Lock()
        self._serving: ReleaseRef | None = None
        self._binding: JSON | None = None

    # -- reading -------------------------------------------------------------------------

    @property
    def binding(self) -> JSON:
        """Fixed for life by the first line, so read once (every request checks it)."""
        if self._binding is None:
            first = self._entries()[0]
            assert first.binding is not None
            self._binding = first.binding
        return self._binding

    def head(self) -> Release:
        return Release.from_entry(_head_entry(self._entries()))

    def last_step(self) -> int:
        return self.log.last_step

    def releases(self) -> list[Release]:
        """Every release of the chain, pending ones included, newest first."""
        return [Release.from_entry(e) for e in reversed(self._entries()) if e.publishes_release]

    def history(self) -> list[CommitEntry]:
        """Every step, rejections, batches and compactions included, oldest first."""
        return self._entries()

    def release(self, release_id: str) -> Release:
        for entry in reversed(self._entries()):
            if entry.publishes_release and entry.release.release_id == release_id:
                return Release.from_entry(entry)
        raise NotFound(f"scenario {self.scenario!r} has no release {release_id}")

    def algorithm_state(self) -> JSON | None:
        return self._entries()[-1].algorithm_state

    def high_water(self) -> int:
        """The experience-store cursor the learner has consumed up to."""
        return self._entries()[-1].high_water

    def open_batches(self) -> list[JSON]:
        """The batches logged for training that no later step closed, oldest first."""
        open_: dict[str, JSON] = {}
        for entry in self._entries():
            if entry.operation is Operation.BATCH and entry.batch:
                open_[entry.batch["batch_id"]] = entry.batch
            elif entry.metrics.get("batch_id") in open_:
                del open_[entry.metrics["batch_id"]]
        return list(open_.values())

    def open_batch(self) -> JSON | None:
        """The oldest open batch, if any."""
        batches = self.open_batches()
        return batches[0] if batches else None

    def consumed_record_ids(self) -> set[str]:
        """Records of batches that training closed (published or rejected)."""
        batches = {e.batch["batch_id"]: e.batch for e in self._entries() if e.operation is Operation.BATCH and e.batch}
        consumed: set[str] = set()
        for entry in self._entries():
            batch_id = entry.metrics.get("batch_id")
            if entry.operation in (Operation.TRAINING, Operation.REJECTION) and batch_id in batches:
                consumed.update(batches[batch_id]["record_ids"])
        return consumed

    # -- serving pointer -------------------------------------------------------------------

    def serving(self) -> ReleaseRef:
        with self._serving_lock:
            if self._serving is None:
                self._serving = self.head().ref
            return self._serving

    def advance(self, expected_head: str, new: ReleaseRef) -> ReleaseRef:
        """Serve `new` (a release of this chain, with its runtime load) from now on."""
        target = self.release(new.release_id)
        if target.pending or target.content_id != new.content_id:
            raise InvalidInput(f"release {new.release_id} is pending or does not hold content {new.content_id}")
        current = self.serving()
        with self._serving_lock:
            if self._serving is None or self._serving.release_id != expected_head:
                raise StaleHead(f"serving release is {self._serving and self._serving.release_id}, not {expected_head}")
            if target.step < self.release(current.release_id).step:
                raise InvalidInput("advance moves forward only; use rollback to serve older content")
            self._serving = new
            return new

    # -- writing -------------------------------------------------------------------------

    def publish(
        self,
        candidate: Candidate,
        expected_parent: str,
        *,
        verdict: Verdict,
        batch_id: str | None = None,
        algorithm_state: JSON | None = None,
        high_water: int | None = None,
        metrics: JSON | None = None,
    ) -> Release:
        """Publish a candidate the gate selected (`select`), or hold it pending (`review`)."""
        if verdict.decision == "reject":
            raise InvalidInput("a rejected candidate is logged with reject(), never published")
        with self.log.transaction():
            head = self._check_head(expected_parent)
            self._check_batch_open(batch_id)
            entry = self._commit_artifact(
                candidate,
                head,
                Operation.TRAINING,
                pending=verdict.decision == "review",
                verdict=verdict,
                batch_id=batch_id,
                algorithm_state=algorithm_state,
                high_water=high_water,
                metrics=metrics,
            )
            return Release.from_entry(entry)

    def reject(
        self,
        candidate_content_id: str,
        expected_head: str,
        *,
        verdict: Verdict,
        batch_id: str | None = None,
        algorithm_state: JSON | None = None,
        high_water: int | None = None,
        metrics: JSON | None = None,
    ) -> CommitEntry:
        if verdict.decision != "reject":
            raise InvalidInput("reject() logs a verdict of reject")
        with self.log.transaction():
            head = self._check_head(expected_head)
            self._check_batch_open(batch_id)
            extra = {"candidate_content_id": candidate_content_id, **_batch_metric(batch_id), **(metrics or {})}
            return self._append_on_head(
                head,
                Operation.REJECTION,
                verdict=verdict,
                metrics=extra,
                algorithm_state=algorithm_state,
                high_water=high_water,
            )

    def rollback(self, target_release_id: str, expected_head: str | None) -> Release:
        """`expected_head` None: on top of whatever the head is once the log is held, so
        concurrent rollbacks each get their own step instead of a `StaleHead`."""
        with self.log.transaction():
            head = _head_entry(self._entries()) if expected_head is None else self._check_head(expected_head)
            target = self.release(target_release_id)
            if target.pending:
                raise InvalidInput(f"release {target_release_id} is pending review; promote it instead")
            candidate = self._candidate_of(target, {"kind": "rollback", "release_id": target_release_id})
            entry = self._commit_artifact(candidate, head, Operation.ROLLBACK, rollback_target=target_release_id)
            return Release.from_entry(entry)

    def promote(self, release_id: str, expected_head: str | None = None) -> Release:
        with self.log.transaction():
            head = _head_entry(self._entries())
            if expected_head is not None:
                self._check_head(expected_head)
            target = self.release(release_id)
            if not target.pending:
                raise InvalidInput(f"release {release_id} is not pending review")
            if any(
                e.operation is Operation.PROMOTE and e.rollback_target_release_id == release_id for e in self._entries()
            ):
                raise Conflict(f"release {release_id} was already promoted")
            candidate = self._candidate_of(target, {"kind": "promote", "release_id": release_id})
            entry = self._commit_artifact(
                candidate, head, Operation.PROMOTE, rollback_target=release_id, verdict=target.verdict
            )
            return Release.from_entry(entry)

    def begin_batch(
        self,
        batch_id: str,
        record_ids: Sequence[str],
        report_ids: Sequence[str],
        *,
        high_water: int,
        expected_step: int,
        max_open: int = 1,
    ) -> CommitEntry:
        """Log a batch before training on it. At most `max_open` batches may be open at once (a
        learner that trains its next candidate while the gate judges the last one has two)."""
        with self.log.transaction():
            since = self._entries()[expected_step:] if 0 <= expected_step <= self.log.last_step else None
            if since is None or any(e.operation not in NOTES for e in since):  # an operator's note changes no batch
                raise StaleHead(f"expected step {expected_step}, the last step is {self.log.last_step}")
            open_ = self.open_batches()
            if len(open_) >= max_open:
                raise Conflict(f"batch {open_[-1]['batch_id']} is still open; finish or abandon it first")
            earlier = {
                rid
                for e in self._entries()
                if e.operation is Operation.BATCH and e.batch
                for rid in e.batch["record_ids"]
            }
            if reused := [rid for rid in record_ids if rid in earlier]:  # a sample is in one batch at most
                raise Conflict(f"records already in a logged batch: {', '.join(reused[:5])}")
            head = _head_entry(self._entries())
            batch = {
                "batch_id": batch_id,
                "record_ids": list(record_ids),
                "report_ids": list(report_ids),
                "from_release_id": head.release.release_id,
            }
            return self._append_on_head(head, Operation.BATCH, batch=batch, high_water=high_water)

    def abandon_batch(self, batch_id: str, reason: str, metrics: JSON | None = None) -> CommitEntry:
        """Close an open batch unused; `metrics`: its candidate's, when one was made."""
        with self.log.transaction():
            if batch_id not in {b["batch_id"] for b in self.open_batches()}:
                raise NotFound(f"no open batch {batch_id} in scenario {self.scenario!r}")
            head = _head_entry(self._entries())
            fields = {**(metrics or {}), "batch_id": batch_id, "reason": reason}
            return self._append_on_head(head, Operation.ABANDON, metrics=fields)

    def compact(self, store: ExperienceStore, record_ids: Sequence[str]) -> CommitEntry:
        """Delete records that training consumed; the log line comes first, then the delete."""
        with self.log.transaction():
            unconsumed = sorted(set(record_ids) - self.consumed_record_ids())
            if unconsumed:
                raise InvalidInput(
                    f"only records consumed by training can be compacted; not consumed: {', '.join(unconsumed)}"
                )
            head = _head_entry(self._entries())
            entry = self._append_on_head(head, Operation.COMPACTION, compacted_ids=tuple(record_ids))
        store.compact(self.scenario, entry.compacted_ids)
        return entry

    def note(
        self, operation: Operation, metrics: JSON, check: Callable[[list[CommitEntry]], None] | None = None
    ) -> CommitEntry:
        """Log a step that moves no release (a settings change, an instruction, a train-now
        request) on the head; `check` sees every step first, under the log's lock, so a caller's
        revision check and this append are one compare-and-swap."""
        if operation not in NOTES:
            raise InvalidInput(f"{operation.value} is not a note")
        with self.log.transaction():
            entries = self._entries()
            if check is not None:
                check(entries)
            return self._append_on_head(_head_entry(entries), operation, metrics=metrics)

    # -- internals -------------------------------------------------------------------------

    def _entries(self) -> list[CommitEntry]:
        entries = self.log.entries()
        if not entries:
            raise NotFound(f"scenario {self.scenario!r} has no commit log")
        return entries

    def _check_batch_open(self, batch_id: str | None) -> None:
        """A logged batch closes once: publishing or rejecting one the log shows closed (by
        another learner that took over the scenario, say) is a `Conflict`."""
        if batch_id is None or batch_id in {b["batch_id"] for b in self.open_batches()}:
            return
        if any(e.operation is Operation.BATCH and e.batch and e.batch["batch_id"] == batch_id for e in self._entries()):
            raise Conflict(f"batch {batch_id} of scenario {self.scenario!r} is already closed")

    def _check_head(self, expected: str) -> CommitEntry:
        head = _head_entry(self._entries())
        if head.release.release_id != expected:
            raise StaleHead(f"scenario {self.scenario!r}: head is {head.release.release_id}, not {expected}")
        return head

    def _candidate_of(self, release: Release, source: JSON) -> Candidate:
        manifest = self.artifacts.manifest(release.release_id)
        return Candidate(
            self.artifacts.files(release.release_id), ArtifactKind(manifest.kind), source, manifest.metadata
        )

    def _commit_artifact(
        self,
        candidate: Candidate,
        head: CommitEntry,
        operation: Operation,
        *,
        pending: bool = False,
        verdict: Verdict | None = None,
        batch_id: str | None = None,
        rollback_target: str | None = None,
        algorithm_state: JSON | None = None,
        high_water: int | None = None,
        metrics: JSON | None = None,
    ) -> CommitEntry:
        manifest = ArtifactManifest(
            candidate.content_id,
            head.release.release_id,
            candidate.kind.value,
            dict(candidate.source),
            dict(candidate.metadata),
        )
        mirror = self._sync_mirror()
        release_id = self.artifacts.commit(self.scenario, candidate.files, manifest, expected_parent=mirror)
        last = self._entries()[-1]
        entry = CommitEntry(
            scenario=self.scenario,
            step=last.step + 1,
            operation=operation,
            release=ReleaseRef(release_id, candidate.content_id),
            parent_release_id=head.release.release_id,
            checkpoint=True,
            pending=pending,
            verdict=verdict,
            algorithm_state=algorithm_state if algorithm_state is not None else last.algorithm_state,
            high_water=high_water if high_water is not None else last.high_water,
            rollback_target_release_id=rollback_target,
            metrics={**_batch_metric(batch_id), **(metrics or {})},
        )
        return self.log.append(entry, expected_step=last.step)

    def _append_on_head(self, head: CommitEntry, operation: Operation, **fields: Any) -> CommitEntry:
        last = self._entries()[-1]
        if fields.get("algorithm_state") is None:
            fields["algorithm_state"] = last.algorithm_state
        if fields.get("high_water") is None:
            fields["high_water"] = last.high_water
        entry = CommitEntry(
            scenario=self.scenario,
            step=last.step + 1,
            operation=operation,
            release=head.release,
            parent_release_id=head.parent_release_id,
            **fields,
        )
        return self.log.append(entry, expected_step=last.step)

    def _sync_mirror(self) -> str | None:
        """The git ref must point at the last artifact the log names; repair it if a crash
        left it ahead (an artifact committed, its log line never written)."""
        logged = last_artifact_release(self._entries())
        if self.artifacts.scenario_head(self.scenario) != logged:
            self.artifacts.reset_scenario_head(self.scenario, logged)
        return logged


# Steps an operator logs beside learning (reef/commit/scenario_settings.py): they move no release
# and close no batch, so a learner's batch logged against the step before one is still sound.
NOTES = frozenset({Operation.SETTINGS, Operation.INSTRUCTION, Operation.TRAIN_NOW})


def last_artifact_release(entries: Sequence[CommitEntry]) -> str | None:
    for entry in reversed(entries):
        if entry.publishes_release:
            return entry.release.release_id
    return None


def _head_entry(entries: Sequence[CommitEntry]) -> CommitEntry:
    for entry in reversed(entries):
        if entry.publishes_release and not entry.pending:
            return entry
    raise NotFound("the commit log has no release")


def _batch_metric(batch_id: str | None) -> JSON:
    return {"batch_id": batch_id} if batch_id else {}
