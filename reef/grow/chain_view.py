"""What a learner reads of its scenario's release chain: the head's content (read once per head),
how far behind the head a release is, the records its logged batches named, and a logged batch's
records read back after a restart."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol

from reef.core.errors import NotFound
from reef.core.types import CommitEntry, Operation, Release, ReleaseRef, ReportedRecords
from reef.observe.store import ExperienceStore


class Chain(Protocol):  # the parts of commit's ReleaseChain a learner uses
    scenario: str

    def last_step(self) -> int: ...
    def head(self) -> Release: ...
    def serving(self) -> ReleaseRef: ...
    def high_water(self) -> int: ...
    def algorithm_state(self) -> dict | None: ...
    def releases(self) -> list[Release]: ...
    def open_batches(self) -> list[dict]: ...
    def history(self) -> list[CommitEntry]: ...
    def begin_batch(
        self,
        batch_id: str,
        record_ids: list[str],
        report_ids: list[str],
        *,
        high_water: int,
        expected_step: int,
        max_open: int = 1,
    ) -> Any: ...
    def abandon_batch(self, batch_id: str, reason: str, metrics: dict | None = None) -> Any: ...


HeadFiles = Callable[[], Awaitable[dict[str, bytes]]]


class ChainView:
    def __init__(self, chain: Chain, head_files: HeadFiles) -> None:
        self.chain = chain
        self.read_head_files = head_files
        self._head: tuple[str, dict[str, bytes]] | None = None
        self._positions: tuple[int, dict[str, int]] | None = None  # (log step, release id -> releases since)

    async def head_files(self) -> dict[str, bytes]:
        """The head's content, read once per head."""
        head = self.chain.head().release_id
        if self._head is None or self._head[0] != head:
            self._head = (head, await self.read_head_files())
        return self._head[1]

    def releases_since(self, release_id: str) -> int | None:
        """How many releases were published after `release_id` (None: not in this chain)."""
        step = self.chain.last_step()
        if self._positions is None or self._positions[0] != step:
            self._positions = (step, {r.release_id: i for i, r in enumerate(self.chain.releases())})  # 0 = the head
        return self._positions[1].get(release_id)


def reported_record(store: ExperienceStore, record_id: str) -> ReportedRecords:
    """A record with its latest report, as a logged batch is read back after a restart."""
    record = store.get_record(record_id)
    reports = store.reports_for(record_id)
    if not reports:
        raise NotFound(f"record {record_id} has no report")
    return ReportedRecords(reports[-1], (record,))


def batched_record_ids(chain: Chain) -> set[str]:
    """Every record a logged batch named, however the batch ended: none is used twice."""
    return {
        rid
        for entry in chain.history()
        if entry.operation is Operation.BATCH and entry.batch
        for rid in entry.batch["record_ids"]
    }
