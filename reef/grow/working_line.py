"""The line of training a learner is on: the candidate training goes on from, the head the line
began at, and how far along it is. A publication starts the line's count again; a line the gate
found worse, or surely worse over its rejected candidates together, is dropped, and so is one a
rollback or promote left behind: its candidates not yet judged are abandoned unjudged (their
`lineage` is older), so no candidate of a line begun before the head moved is canaried or judged."""

from __future__ import annotations

from dataclasses import dataclass, field

from reef.core.types import Operation, Release, Verdict
from reef.grow.learner_stats import LineageEvidence, promising


@dataclass
class WorkingLine:
    head: str  # the release the line continues from; a rollback or promote moves it
    files: dict[str, bytes] | None = None  # the last candidate, once training goes on from it
    lineage: int = 0  # bumped whenever the line is dropped: its candidates are void
    drop_reason: str = ""
    made: int = 0  # batches in the line, counted from the head it began at
    published: int = 0  # the position in the line of the release this learner published last
    evidence: LineageEvidence = field(default_factory=LineageEvidence)  # the gate's wins and losses since it began

    def follow(self, head: str) -> bool:
        """The line continues from `head` from now on; whether that moved it (a line left behind is dropped)."""
        moved, self.head = head != self.head, head
        return moved

    def extend(self, files: dict[str, bytes]) -> None:
        """A candidate was made: the next trains on from it."""
        self.files, self.made = files, self.made + 1

    def drop(self, reason: str) -> None:
        self.files, self.lineage, self.drop_reason = None, self.lineage + 1, reason
        self.made = self.published = 0
        self.evidence = LineageEvidence()

    def published_at(self, position: int) -> None:
        self.published, self.evidence = position, LineageEvidence()

    def why_drop(self, rejected: Verdict) -> str | None:
        """Why a rejected candidate ends the line (None: training goes on from it)."""
        if not promising(rejected):  # the next candidate starts from the head
            return "the gate found it worse than the serving release"
        if self.evidence.add(rejected).surely_worse():
            e = self.evidence
            return f"its line lost {e.losses} to {e.wins} over {e.verdicts} rejected candidates"
        return None

    def outrun_by(self, head: Release, judging: bool) -> bool:
        """Whether `head` is no longer the one the line continues from, other than by this
        learner's own publication (`judging`: its gate may make one before the verdict reaches it)."""
        if head.release_id == self.head:
            return False
        own = judging and head.operation is Operation.TRAINING and head.parent_release_id == self.head
        return not own
