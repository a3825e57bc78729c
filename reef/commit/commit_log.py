"""The commit log: one append-only JSONL file per scenario, the source of truth.

Each line is one step (`CommitEntry`), numbered strictly +1 from 1. The fsynced append is the
commit point: a step exists once `append` returns and not before. Appends are serialised
across threads by a lock and across processes by `flock` on the file, and each append first
reads any lines another process added, so the expected-step check is a true compare-and-swap.

Damage: a last line without its newline is a torn write (the writer died before the fsync
that would have acknowledged it) and is truncated; anything else that does not parse, or a
step out of sequence, raises `Corruption` naming the file and line. The truncation happens only
while the reader holds the `flock`, and every writer holds it from its write to its fsync, so a
tail seen there is always a dead writer's, never a live one's half-written line: several
processes can open and repair one state directory at once, and the first to look repairs it.

Descriptors: a log holds its file open only while it is locked (each read or append, or a
transaction), and closes it when the lock is released, so an idle scenario holds no descriptor
and a server with thousands of scenarios does not run out (before, each held one for life: past
~1,000 scenarios every route failed). Each lock opens the file again and reads only what was
appended since the last look (the parsed steps and their byte offset stay in memory), so the
`flock`, the torn-line cut and the compare-and-swap of an append are exactly as before.

`CommitLog` and `CommitLogs` are the interface the release chain and the state directory use;
`JsonlCommitLog` / `JsonlCommitLogs` (here: one file per scenario in `<state>/commits/`, the
single-node default) and `PgCommitLog` / `PgCommitLogs` (`reef/commit/pg_commit_log.py`: one
append-only table shared by every front end on a PostgreSQL database) implement it, and one
contract suite (`tests/test_commit_log.py`) runs against both.
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
from typing import ContextManager, Iterator, Protocol, Sequence, runtime_checkable

from reef.commit.archived_names import archived_name, split_archived
from reef.commit.jsonl_heads import JsonlHeads, JsonlWatch, scenario_of
from reef.core.canonical import canonical_json, check_scenario_name, scenario_key
from reef.core.errors import Conflict, Corruption, InvalidInput, StaleHead, StorageUnavailable
from reef.core.types import CommitEntry

ARCHIVE_DIR = "archived"  # archived scenarios' logs: <key>.<stamp>.jsonl, never read as scenarios


@runtime_checkable
class CommitLog(Protocol):
    """One scenario's steps, append-only, numbered strictly +1 from 1.

    - `entries()`, `last_step`, `last()` read the committed steps, including those another
      thread, process or front end committed since the last read.
    - `append(entry, expected_step)` is the commit point and a compare-and-swap: the step is
      durable when it returns; a stale `expected_step` is `StaleHead`; an identical retry of a
      committed step (ignoring `recorded_at`) returns the original; other content for a
      committed step is `Conflict`.
    - `transaction()` holds the log exclusively (threads, processes, front ends) across several
      calls, so a caller can check the head, write an artifact and append as one
      compare-and-swap. Appends inside it commit as they return, as outside; so append last
      (a shared log may let another writer in between an append and the transaction's next
      call, which then sees that writer's steps).
    """

    scenario: str | None

    def entries(self) -> list[CommitEntry]: ...

    @property
    def last_step(self) -> int: ...

    def last(self) -> CommitEntry | None: ...

    def append(self, entry: CommitEntry, expected_step: int) -> CommitEntry: ...

    def transaction(self) -> ContextManager[CommitLog]: ...

    def archive(self, archived_as: str) -> None:
        """Move every step aside under `archived_as` (`reef/commit/archived_names.py`), unchanged,
        and close the log: the scenario's name has no steps any more. The commit point of an
        archive; durable when it returns."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class CommitLogs(Protocol):
    """Where every scenario's commit log lives (a directory of files, a database table)."""

    where: str  # for error messages

    def open(self, scenario: str) -> CommitLog:
        """The log of `scenario` (empty until its creation step is appended)."""
        ...

    def recover(self) -> list[CommitLog]:
        """The log of every scenario that has steps, read and checked (a torn last line is
        truncated; other damage is `Corruption` naming where), each starting with a creation."""
        ...

    def archived(self) -> dict[str, int]:
        """Every archived scenario's log: its archived name and how many steps it has."""
        ...

    def adopt(self, scenario: str, entries: Sequence[CommitEntry]) -> bool:
        """Take `entries` (a scenario's whole log, from another backend) as this scenario's
        steps, all or nothing, if it has none yet; False if it already has steps."""
        ...

    def close(self) -> None: ...


class JsonlCommitLogs:
    """One JSONL file per scenario under `directory` (`<key>.jsonl`, key = urlsafe base64).

    `shared`: several processes serve this state directory (`reef serve --workers N` on it), so
    each follows the others' appends (`heads`, `watch`: `reef/commit/jsonl_heads.py`) as front
    ends on PostgreSQL do. The files are safe to share either way: every read and append holds
    the file's `flock`; `shared` only says whether to look for other writers' steps."""

    def __init__(self, directory: Path | str, *, shared: bool = False) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.where = str(self.directory)
        self.shared = shared
        self._heads = JsonlHeads(self.directory)

    def path_of(self, scenario: str) -> Path:
        return self.directory / f"{scenario_key(check_scenario_name(scenario))}.jsonl"

    def open(self, scenario: str) -> JsonlCommitLog:
        return JsonlCommitLog(self.path_of(scenario), scenario=scenario)

    def recover(self) -> list[CommitLog]:
        logs: list[CommitLog] = []
        try:
            for path in sorted(self.directory.glob("*.jsonl")):
                log = JsonlCommitLog(path)
                entries = log.entries()
                if not entries:
                    log.close()  # a creation that crashed before its first line
                    continue
                scenario = entries[0].scenario
                if scenario_key(scenario) != path.stem or entries[0].operation.value != "creation":
                    log.close()
                    raise Corruption(
                        str(path), 1, "the first line must be the creation of the scenario the file is named for"
                    )
                log.scenario = scenario
                logs.append(log)
        except BaseException:
            for log in logs:
                log.close()
            raise
        return logs

    def adopt(self, scenario: str, entries: Sequence[CommitEntry]) -> bool:
        return adopt_entries(self, scenario, entries)

    def archived(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for path in sorted((self.directory / ARCHIVE_DIR).glob("*.jsonl")):
            key, _, stamp = path.stem.partition(".")
            scenario = scenario_of(f"{key}.jsonl")
            if scenario is not None and stamp:
                with path.open("rb") as lines:
                    out[archived_name(scenario, stamp)] = sum(1 for _ in lines)
        return out

    def exists(self, scenario: str) -> bool:
        """Whether the scenario has a log file (a look that creates none)."""
        return self.path_of(scenario).is_file()

    def heads(self) -> dict[str, int]:
        """Every scenario with steps, and its last step (read without the files' locks)."""
        return self._heads.heads()

    def watch(self) -> JsonlWatch:
        """Wakes a follower when any log file changes (`JsonlWatch.wait`)."""
        return JsonlWatch(self.directory)

    def close(self) -> None:
        pass


class JsonlCommitLog:
    """One scenario's log as one fsynced JSONL file, locked across processes with `flock`."""

    def __init__(self, path: Path | str, scenario: str | None = None) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self.scenario = scenario
        self._lock = threading.RLock()
        self._depth = 0  # re-entry count of _locked in the owning thread
        self._entries: list[CommitEntry] = []
        self._offset = 0  # bytes of the file already parsed into _entries
        self._fd = -1  # open only while locked
        self._closed = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        with self._locked():
            pass
        if created:
            _fsync_dir(self.path.parent)

    def close(self) -> None:
        self._closed = True  # a lock held now still ends normally, closing the file

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
            existing = committed_retry(str(self.path), self._entries, entry, expected_step)
            if existing is not None:
                return existing
            entry = stamped(entry)
            self._write_line(canonical_json(entry.to_json()).encode("utf-8") + b"\n")
            self._entries.append(entry)
            return entry

    def append_all(self, entries: Sequence[CommitEntry]) -> None:
        """Write a whole log (steps 1..n) into this empty one with one write and one fsync."""
        with self._locked():
            check_whole_log(str(self.path), self.scenario, self._entries, entries)
            new = [stamped(e) for e in entries]
            self._write_line(b"".join(canonical_json(e.to_json()).encode("utf-8") + b"\n" for e in new))
            self._entries.extend(new)

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

    def archive(self, archived_as: str) -> None:
        scenario, stamp = split_archived(archived_as)
        target = self.path.parent / ARCHIVE_DIR / f"{scenario_key(scenario)}.{stamp}.jsonl"
        target.parent.mkdir(exist_ok=True)
        with self._locked():  # no append of this process in between; the rename keeps the file whole
            os.rename(self.path, target)
            _fsync_dir(target.parent)
            _fsync_dir(self.path.parent)
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[JsonlCommitLog]:
        """Hold the log exclusively (threads and processes) across several calls, so that a
        caller can check the head, write an artifact and append as one compare-and-swap."""
        with self._locked():
            yield self

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the log: open its file, `flock` it, read what other processes appended; on the
        way out close the file (which releases the `flock`)."""
        with self._lock:
            if self._closed:
                raise StorageUnavailable(f"{self.path}: commit log is closed")
            self._depth += 1
            try:
                if self._depth == 1:
                    self._fd = self._open()
                    fcntl.flock(self._fd, fcntl.LOCK_EX)
                    self._read_new_lines()
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd >= 0:
                    os.close(self._fd)
                    self._fd = -1

    def _open(self) -> int:
        try:  # O_CREAT: a file removed under a log with steps reads as shrunk (Corruption), not as absent
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:  # EMFILE, EACCES, EIO: this log cannot be read now
            raise StorageUnavailable(f"{self.path}: cannot open the commit log: {exc}") from exc

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


def committed_retry(
    where: str, entries: Sequence[CommitEntry], entry: CommitEntry, expected_step: int
) -> CommitEntry | None:
    """The compare-and-swap of `append`, decided alike by both logs over the steps `entries`
    committed so far: the committed step when `entry` is an identical retry of it, None when
    `entry` is the next step. Other content for a committed step is a `Conflict`, an
    `expected_step` that is no longer the last step `StaleHead`."""
    last = len(entries)
    if 1 <= entry.step <= last:
        existing = entries[entry.step - 1]
        if canonical_json(existing.identity()) == canonical_json(entry.identity()):
            return existing
        raise Conflict(f"{where}: step {entry.step} is already committed with other content")
    if expected_step != last:
        raise StaleHead(f"{where}: expected step {expected_step}, but the last step is {last}")
    if entry.step != last + 1:
        raise InvalidInput(f"step must be {last + 1}, got {entry.step}")
    return None


def check_whole_log(
    where: str, scenario: str | None, entries: Sequence[CommitEntry], new: Sequence[CommitEntry]
) -> None:
    """That `new` may be written by `append_all` into a log holding `entries`: the log is empty
    and `new` is steps 1..n of its scenario."""
    if entries:
        raise Conflict(f"{where}: the log already has {len(entries)} steps")
    for i, entry in enumerate(new, 1):
        if entry.step != i or (scenario is not None and entry.scenario != scenario):
            raise InvalidInput(f"{where}: cannot adopt step {entry.step} of {entry.scenario!r} as step {i}")


def stamped(entry: CommitEntry) -> CommitEntry:
    """The entry with the time it is recorded at, unless it has one (an import keeps its own)."""
    return entry if entry.recorded_at else replace(entry, recorded_at=time.time())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def adopt_entries(logs: CommitLogs, scenario: str, entries: Sequence[CommitEntry]) -> bool:
    """Write a scenario's whole history into a log that has none yet (an import); False, and
    nothing written, when the log already has steps."""
    log = logs.open(scenario)
    try:
        with log.transaction():
            if log.last_step:
                return False
            log.append_all(entries)
            return True
    finally:
        log.close()
