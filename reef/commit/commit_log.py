"""The commit log: one append-only JSONL file per scenario, the source of truth.

Each line is one step (`CommitEntry`), numbered strictly +1 from 1. The fsynced append is the
commit point: a step exists once `append` returns and not before. Appends are serialised
across threads by a lock and across processes by `flock` on the file, and each append first
reads any lines another process added, so the expected-step check is a true compare-and-swap.

Damage: a last line without its newline is a torn write (the writer died before the fsync
that would have acknowledged it) and is truncated; anything else that does not parse, or a
step out of sequence, raises `Corruption` naming the file and line.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from reef.core.canonical import canonical_json
from reef.core.errors import Conflict, Corruption, InvalidInput, StaleHead, StorageUnavailable
from reef.core.types import CommitEntry


class CommitLog:
    def __init__(self, path: Path | str, scenario: str | None = None) -> None:
        self.path = Path(path)
        self.scenario = scenario
        self._lock = threading.RLock()
        self._depth = 0  # re-entry count of _locked in the owning thread
        self._entries: list[CommitEntry] = []
        self._offset = 0  # bytes of the file already parsed into _entries
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if created:
            _fsync_dir(self.path.parent)
        with self._locked():
            pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- reading -------------------------------------------------------------------------

    def entries(self) -> list[CommitEntry]:
        with self._locked():
            return list(self._entries)

    @property
    def last_step(self) -> int:
        with self._locked():
            return len(self._entries)

    def last(self) -> CommitEntry | None:
        with self._locked():
            return self._entries[-1] if self._entries else None

    # -- writing -------------------------------------------------------------------------

    def append(self, entry: CommitEntry, expected_step: int) -> CommitEntry:
        """Commit `entry` as step `expected_step + 1`; return the committed line.

        An identical retry of a committed step returns the original. Other content for a
        committed step, or an `expected_step` that is no longer the last step, is a conflict.
        """
        if self.scenario is not None and entry.scenario != self.scenario:
            raise InvalidInput(f"entry for scenario {entry.scenario!r} in the log of {self.scenario!r}")
        with self._locked():
            last = len(self._entries)
            if 1 <= entry.step <= last:
                existing = self._entries[entry.step - 1]
                if canonical_json(existing.identity()) == canonical_json(entry.identity()):
                    return existing
                raise Conflict(f"{self.path}: step {entry.step} is already committed with other content")
            if expected_step != last:
                raise StaleHead(f"{self.path}: expected step {expected_step}, but the last step is {last}")
            if entry.step != last + 1:
                raise InvalidInput(f"step must be {last + 1}, got {entry.step}")
            if not entry.recorded_at:
                entry = _with_time(entry)
            self._write_line(canonical_json(entry.to_json()).encode("utf-8") + b"\n")
            self._entries.append(entry)
            return entry

    def _write_line(self, line: bytes) -> None:
        start = self._offset
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, "short write")
            os.fsync(self._fd)
        except OSError as exc:
            os.ftruncate(self._fd, start)  # leave no torn line behind
            raise StorageUnavailable(f"{self.path}: cannot append to the commit log: {exc}") from exc
        self._offset = start + len(line)

    # -- locking and parsing ---------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[CommitLog]:
        """Hold the log exclusively (threads and processes) across several calls, so that a
        caller can check the head, write an artifact and append as one compare-and-swap."""
        with self._locked():
            yield self

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            if self._fd < 0:
                raise StorageUnavailable(f"{self.path}: commit log is closed")
            self._depth += 1
            try:
                if self._depth == 1:
                    fcntl.flock(self._fd, fcntl.LOCK_EX)
                    self._read_new_lines()
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read_new_lines(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == self._offset:
            return
        if size < self._offset:
            raise Corruption(str(self.path), None, f"file shrank from {self._offset} to {size} bytes")
        data = os.pread(self._fd, size - self._offset, self._offset)
        lines = data.split(b"\n")
        tail = lines.pop()  # bytes after the last newline: empty, or a torn write
        offset = self._offset
        for raw in lines:
            self._entries.append(self._parse(raw, len(self._entries) + 1))
            offset += len(raw) + 1
        if tail:
            os.ftruncate(self._fd, offset)
            os.fsync(self._fd)
        self._offset = offset

    def _parse(self, raw: bytes, line_no: int) -> CommitEntry:
        try:
            entry = CommitEntry.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            raise Corruption(str(self.path), line_no, f"unreadable commit line: {exc}") from None
        if entry.step != line_no:
            raise Corruption(str(self.path), line_no, f"step {entry.step} where step {line_no} belongs")
        if self.scenario is not None and entry.scenario != self.scenario:
            raise Corruption(str(self.path), line_no, f"line of scenario {entry.scenario!r}")
        return entry


def _with_time(entry: CommitEntry) -> CommitEntry:
    return replace(entry, recorded_at=time.time())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
