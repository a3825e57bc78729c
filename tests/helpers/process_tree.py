"""A process and everything it started, read from /proc: `kill_tree(pid)` SIGKILLs them all at
once, as a container stop or a cgroup kill does (where `os.kill(pid)` leaves a child, such as a
`git` the process was running, to finish on its own)."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every process `pid` started, and what they started, deepest last."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop(0)
        found.append(child)
        todo += children.get(child, ())
    return found


def kill_tree(pid: int) -> list[int]:
    """SIGKILL `pid`'s descendants and `pid` in one sweep; the pids signalled."""
    tree = [*reversed(descendants(pid)), pid]
    for member in tree:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return tree
