"""Releases a front end cannot serve because it cannot read their content.

A front end on a shared commit log serves every head the others publish, fetching the content
from the artifact remote. When it cannot read a release (no remote, or the remote lacks it too:
`MissingArtifact`), it keeps serving the last release of that scenario it has loaded, never
answers from content it does not have, and says so:

- one warning per distinct problem (logger `reef.follow`), and one when it serves the head again;
- `/reef/status` `serving.unreachable[]`: per scenario, the release it cannot read, why, since
  when, and what it serves instead (`serving_release_id`; null when it has nothing to serve);
- the gauge `reef_scenarios_unreachable{serving="older"|"none"}`.

A scenario it has no release of to serve answers 503 (`ReleaseUnreachable`, naming the release
and the fix), never 404: the release exists, this front end cannot reach it. Such an answer
does not try the read again for a second after the last try (the follower retries every second),
so a burst of requests to it costs no git fetch each.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from reef.core.errors import StorageUnavailable

log = logging.getLogger("reef.follow")
FIX = (
    "every front end on a shared commit log must reach every release's content: set artifacts.remote "
    "to one git repository they all reach (docs/deploy.md)"
)


class ReleaseUnreachable(StorageUnavailable):
    """A release this front end cannot read, already recorded and logged (HTTP 503)."""


@dataclass(frozen=True)
class Unreachable:
    scenario: str
    release_id: str  # the release it cannot read
    serving_release_id: str | None  # what it serves instead; None: nothing
    reason: str
    since: float  # wall clock of the first failure to read this release
    tried: float  # monotonic clock of the last try

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "release_id": self.release_id,
            "serving_release_id": self.serving_release_id,
            "reason": self.reason,
            "since": self.since,
        }


class UnreachableReleases:
    """Per scenario, the release this front end could not read at its last try. Thread-safe."""

    def __init__(self) -> None:
        self._by_scenario: dict[str, Unreachable] = {}
        self._lock = threading.Lock()

    def note(self, scenario: str, release_id: str, serving_release_id: str | None, reason: str) -> None:
        """Record a failed read (logged when the problem is new or changed)."""
        with self._lock:
            old = self._by_scenario.get(scenario)
            since = old.since if old is not None and old.release_id == release_id else time.time()
            new = Unreachable(scenario, release_id, serving_release_id, reason, since, time.monotonic())
            self._by_scenario[scenario] = new
        if old is None or (old.release_id, old.serving_release_id, old.reason) != (
            release_id,
            serving_release_id,
            reason,
        ):
            instead = (
                f"serving release {serving_release_id} meanwhile"
                if serving_release_id
                else "it has no release of it to serve: its requests get 503"
            )
            log.warning("scenario %s: cannot read release %s (%s); %s; %s", scenario, release_id, reason, instead, FIX)

    def clear(self, scenario: str) -> None:
        """The scenario's head is served: no longer behind."""
        with self._lock:
            old = self._by_scenario.pop(scenario, None)
        if old is not None:  # at the level of the warning it ends, so whoever saw that sees this
            log.warning(
                "scenario %s: serving its head again (release %s was unreachable for %.0f s)",
                scenario,
                old.release_id,
                time.time() - old.since,
            )

    def recent(self, scenario: str, release_id: str, within_s: float) -> Unreachable | None:
        """The record of a failed read of this release tried less than `within_s` ago."""
        with self._lock:
            entry = self._by_scenario.get(scenario)
        if entry is None or entry.release_id != release_id or time.monotonic() - entry.tried >= within_s:
            return None
        return entry

    def status(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._by_scenario[name].to_json() for name in sorted(self._by_scenario)]

    def count(self, serving: str) -> int:
        """Scenarios behind that serve an `older` release, or `none`."""
        with self._lock:
            return sum(
                (entry.serving_release_id is None) == (serving == "none") for entry in self._by_scenario.values()
            )
