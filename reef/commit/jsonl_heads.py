"""Following JSONL commit logs that other processes append to (one state directory, several processes).

PostgreSQL tells a front end that a step committed (NOTIFY); a file tells nobody, so a process
that shares a state directory with others looks: `JsonlHeads.heads()` maps every scenario with
steps to its last step, and `JsonlWatch.wait()` wakes the head follower
(`reef.serve.scenarios.HeadFollower`, the same one PostgreSQL front ends run) as soon as a log
file's size or mtime changed, checking every `POLL_S`.

Why counting lines is enough: step n is line n (`JsonlCommitLog` refuses anything else), so the
last step is the number of complete lines. Only the bytes added since the last look are read,
and a file whose size and mtime did not change is not read at all, so a look costs one `stat`
per scenario. The scenario's name is the file's name decoded (`scenario_key` is reversible).

Why no lock: these reads only say that something moved. The follower then reads the head
through the log itself, under its `flock`, so it waits for a writer that is still between its
write and its fsync, and never serves a line that did not commit (a failed append removes its
line; the count then goes back, and the follower looks again).
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from reef.core.canonical import scenario_key

POLL_S = 0.25  # how often a waiting follower stats the log files
Stamp = tuple[int, int]  # (size, mtime_ns)


@dataclass
class _Counted:
    scenario: str | None
    offset: int = 0  # bytes of complete lines counted
    lines: int = 0
    stamp: Stamp = (-1, -1)


class JsonlHeads:
    """The last step of every JSONL log in a directory, read incrementally. Thread-safe."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[str, _Counted] = {}
        self._lock = threading.Lock()

    def heads(self) -> dict[str, int]:
        with self._lock:
            out: dict[str, int] = {}
            for name, stamp in stamps(self.directory).items():
                counted = self._count(name, stamp)
                if counted.scenario is not None and counted.lines:
                    out[counted.scenario] = counted.lines
            return out

    def _count(self, name: str, stamp: Stamp) -> _Counted:
        counted = self._files.get(name)
        if counted is not None and counted.stamp == stamp:
            return counted
        if counted is None or stamp[0] < counted.offset:  # new, or a failed append took its line back
            counted = self._files[name] = _Counted(scenario_of(name))
        try:
            with open(self.directory / name, "rb") as f:
                f.seek(counted.offset)
                data = f.read()
        except FileNotFoundError:
            self._files.pop(name, None)
            return _Counted(None)
        complete = data[: data.rfind(b"\n") + 1]  # bytes after the last newline: an append in progress
        counted.lines += complete.count(b"\n")
        counted.offset += len(complete)
        counted.stamp = stamp
        return counted


class JsonlWatch:
    """Wakes a follower when a log file of the directory changed (`wait`), like
    `PgCommitLogs.watch()`: the first wait returns at once, so the caller looks once."""

    def __init__(self, directory: Path, poll: float = POLL_S) -> None:
        self.directory = directory
        self.poll = poll
        self._last: dict[str, Stamp] | None = None
        self._closed = threading.Event()

    def wait(self, timeout: float) -> bool:
        """True as soon as a log file changed since the last wait; False after `timeout`."""
        deadline = time.monotonic() + timeout
        while not self._closed.is_set():
            now = stamps(self.directory)
            if now != self._last:
                self._last = now
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._closed.wait(min(self.poll, remaining))
        return False

    def close(self) -> None:
        self._closed.set()


def stamps(directory: Path) -> dict[str, Stamp]:
    """(size, mtime_ns) of every `*.jsonl` file in the directory."""
    out: dict[str, Stamp] = {}
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return out
    for entry in entries:
        if entry.name.endswith(".jsonl"):
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            out[entry.name] = (st.st_size, st.st_mtime_ns)
    return out


def scenario_of(file_name: str) -> str | None:
    """The scenario a log file is named for (`<scenario_key>.jsonl`), or None for another file."""
    stem = file_name[: -len(".jsonl")]
    try:
        name = base64.urlsafe_b64decode(stem + "=" * (-len(stem) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return name if scenario_key(name) == stem else None
