"""Lock files a killed git left in an artifact repository, and when one may be removed.

Before git moves a ref it creates `<ref>.lock` (exclusively), writes the new value into it and
renames it over the ref. A git killed in between (SIGKILL to Reef's process group, the OOM
killer, a container stopped) leaves the lock behind, and every later move of that ref fails
with "cannot lock ref" after `core.filesRefLockTimeout`, across restarts, until the file goes:
git never removes another process's lock.

A lock may be removed only when no live git holds it. Two things prove that together:

- The caller holds what every Reef writer of that ref holds while it writes, in this and every
  other process: a scenario's ref moves only while its commit log is held, the local
  `refs/reef/fetched/*` and `refs/reef/lfs/*` only while the repository's fetch lock is held
  (`ArtifactStore`). So no live Reef is writing it; only a git whose Reef died can own the lock.
- The lock is old enough that such an orphan is done. A git whose Reef alone was killed runs on
  (its own session: `ArtifactStore._run`), and a ref update holds its lock for milliseconds, so
  a lock `OWNED_AGE_S` old is a dead git's.

Where the caller cannot exclude every writer (the shared remote, a bare repository other front
ends push to; `packed-refs`, which any ref deletion locks), only age speaks: git holds a ref lock
for the moment of the update, so a lock `SHARED_AGE_S` old is taken as a dead writer's.

`clear_stale` waits while a lock is younger than the age asked (a live writer finishing removes
it, and then nothing is removed), and removes it once it is that old: by its mtime, or by how
long this call has watched it if that is longer (so a lock left long ago goes at once, and one
with an mtime in the future still goes after `min_age_s`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("reef.artifacts")

OWNED_AGE_S = 2.0  # a lock on a ref whose every live writer the caller excludes
SHARED_AGE_S = 10.0  # a lock on the remote or on packed-refs: another front end may be the writer
_POLL_S = 0.02


@dataclass(frozen=True)
class StaleLock:
    """A lock file found and removed: where, and how old it was."""

    path: str
    age_s: float

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "age_s": round(self.age_s, 1)}


def clear_stale(path: Path, min_age_s: float) -> StaleLock | None:
    """Remove the lock file at `path` once it is `min_age_s` old; None if there is none (or
    its writer removed it meanwhile)."""
    watched_since = time.monotonic()
    while True:
        age = _age(path)
        if age is None:
            return None
        age = max(age, time.monotonic() - watched_since)
        if age >= min_age_s:
            break
        time.sleep(min(_POLL_S, min_age_s - age))
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    log.warning("removed a stale git lock %s (%.1f s old): a git killed while it moved that ref left it", path, age)
    return StaleLock(str(path), age)


def locks_under(directory: Path) -> list[Path]:
    """Every `*.lock` file below `directory` (none if it does not exist)."""
    found: list[Path] = []
    for parent, _, names in os.walk(directory):
        found.extend(Path(parent, name) for name in names if name.endswith(".lock"))
    return sorted(found)


def _age(path: Path) -> float | None:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None
