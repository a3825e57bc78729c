"""Archiving a scenario: its records, commit log and artifact ref moved aside, nothing deleted.

`archive_scenario` moves, under the scenario's commit log (so no publish, rollback or creation of
it runs in between), in this order: the experience store's records, reports and tombstones
(`ExperienceStore.archive_scenario`), the artifact store's ref (`refs/reef/archived/<key>/<stamp>`:
every release stays reachable), and last the commit log itself, whose move is the commit point
(a JSONL log is renamed into `commits/archived/`; a PostgreSQL log's rows are re-keyed). All go
under one archived name, `archived/<scenario>/<stamp>` (`reef/commit/archived_names.py`), which no
scenario can have. Afterwards the name is free: a request to it creates a new scenario under
today's rules (`limits.max_scenarios`), starting empty at step 1.

A crash before the log's move leaves the scenario live (recovery puts its git ref back from the
log) with the records moved so far kept aside under the archived name; archiving it again
finishes the job under a new name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reef.commit.archived_names import archived_at, archived_name, new_stamp, split_archived
from reef.commit.state import ReefState


@dataclass(frozen=True)
class ArchivedScenario:
    scenario: str
    archived_as: str
    archived_at: str  # ISO 8601, UTC
    steps: int
    head_release_id: str | None = None  # known when this process archived it
    records: int | None = None  # likewise: how many records moved aside

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "archived_as": self.archived_as,
            "archived_at": self.archived_at,
            "steps": self.steps,
            "head_release_id": self.head_release_id,
            "records": self.records,
        }


def archive_scenario(state: ReefState, scenario: str) -> ArchivedScenario:
    """Move the scenario aside (see the module's doc); `NotFound` for an unknown scenario. The
    caller has stopped its learner: nothing else appends to its log meanwhile."""
    chain = state.chain(scenario)
    stamp = new_stamp()
    name = archived_name(scenario, stamp)
    with chain.log.transaction():
        steps = chain.log.last_step
        head = chain.head().release_id
        records = state.store.archive_scenario(scenario, name)
        state.artifacts.archive_scenario_head(scenario, stamp)
        chain.log.archive(name)
    state.forget(scenario)
    return ArchivedScenario(scenario, name, archived_at(stamp), steps, head, records)


def archived_scenarios(state: ReefState) -> list[ArchivedScenario]:
    """Every archived scenario the state's commit logs keep, oldest name first."""
    out = []
    for name, steps in state.commit_logs.archived().items():
        scenario, stamp = split_archived(name)
        out.append(ArchivedScenario(scenario, name, archived_at(stamp), steps))
    return sorted(out, key=lambda a: (a.scenario, a.archived_as))
