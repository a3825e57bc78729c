"""Learner leases on one machine: a file lock per scenario, for processes sharing a state directory.

`FileLeases` is the `Leases` of processes that serve one state directory together
(`reef serve --workers N` without PostgreSQL): the lease of a scenario is an exclusive
`flock` on `<state>/leases/<scenario_key>.lock`, taken without waiting (`LOCK_NB`) and held on a
descriptor the holder keeps open. The holder writes its name into the file, so every process can
say who holds each lease (`holders` probes a file with a non-blocking shared lock: granted means
nobody holds it; refused means the name in the file is the holder's).

Why `flock`: like PostgreSQL's advisory lock (`reef/commit/leases.py`), it lives exactly as long
as its holder. The kernel drops it when the descriptor closes, which includes every way a process
dies (crash, SIGKILL, out of memory), so another process takes the lease on its next try (within
the lease loop's second) with no expiry, renewal or clock. The lock files are never deleted:
deleting one while held would let a second process lock a new file of the same name. A holder
whose file was replaced anyway (someone cleared `leases/`) has lost its lease, and `keep` says so.

As with PostgreSQL, the lease keeps one learner running; the commit log keeps learning correct
(batches logged first, closed once, every step a compare-and-swap).
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import Iterable

from reef.core.canonical import check_scenario_name, scenario_key
from reef.core.errors import StorageUnavailable


class FileLeases:
    """The learner leases of one process on a shared state directory. Thread-safe."""

    kind = "file lock"

    def __init__(self, directory: Path | str, holder: str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.holder = holder  # this process, as the others see it
        self._held: dict[str, int] = {}  # scenario -> the descriptor holding its lock
        self._lock = threading.Lock()

    def path_of(self, scenario: str) -> Path:
        return self.directory / f"{scenario_key(check_scenario_name(scenario))}.lock"

    def keep(self) -> set[str]:
        """The scenarios whose lease this process still holds (a replaced lock file is lost)."""
        with self._lock:
            for scenario, fd in list(self._held.items()):
                if not self._still_ours(scenario, fd):
                    del self._held[scenario]
                    os.close(fd)
            return set(self._held)

    def try_take(self, scenario: str) -> bool:
        """Take the scenario's lease if no process holds it; True if this one holds it now."""
        with self._lock:
            if scenario in self._held:
                return True
            try:
                fd = os.open(self.path_of(scenario), os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise StorageUnavailable(f"cannot take the learner lease of {scenario!r}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # EWOULDBLOCK: another process holds it
                os.close(fd)
                return False
            os.ftruncate(fd, 0)
            os.pwrite(fd, self.holder.encode(), 0)
            self._held[scenario] = fd
            return True

    def release(self, scenario: str) -> None:
        with self._lock:
            fd = self._held.pop(scenario, None)
            if fd is not None:
                _let_go(fd)

    def holders(self, scenarios: Iterable[str]) -> dict[str, str | None]:
        """Who holds each scenario's lease (a process's name), or None where nobody does."""
        out: dict[str, str | None] = {}
        for scenario in scenarios:
            with self._lock:
                held_here = scenario in self._held
            out[scenario] = self.holder if held_here else self._probe(scenario)
        return out

    def close(self) -> None:
        with self._lock:
            for fd in self._held.values():
                _let_go(fd)
            self._held.clear()

    def _probe(self, scenario: str) -> str | None:
        try:
            fd = os.open(self.path_of(scenario), os.O_RDONLY)
        except FileNotFoundError:
            return None  # nobody ever took it
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return os.pread(fd, 1024, 0).decode(errors="replace")
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def _still_ours(self, scenario: str, fd: int) -> bool:
        try:
            return os.stat(self.path_of(scenario)).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False


def _let_go(fd: int) -> None:
    """Clear the holder's name, then close: closing the descriptor releases the lock."""
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
