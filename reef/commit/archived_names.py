"""The name an archived scenario's records, commit log and artifact ref are kept under.

`archived/<scenario>/<stamp>` (the stamp: when, in UTC to the microsecond): no scenario can
have it (a scenario name has no `/`), so the experience store's rows, a PostgreSQL commit log's
rows and the listing all move aside under it, and a new scenario of the same name starts empty.
"""

from __future__ import annotations

from datetime import datetime, timezone

from reef.core.canonical import check_scenario_name
from reef.core.errors import InvalidInput

PREFIX = "archived/"


def new_stamp(now: datetime | None = None) -> str:
    return (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S%fZ")


def archived_name(scenario: str, stamp: str) -> str:
    return f"{PREFIX}{check_scenario_name(scenario)}/{stamp}"


def split_archived(name: str) -> tuple[str, str]:
    """(the scenario, the stamp) of an archived name; `InvalidInput` for any other."""
    scenario, _, stamp = name.removeprefix(PREFIX).partition("/")
    if not name.startswith(PREFIX) or not stamp or "/" in stamp:
        raise InvalidInput(f"not an archived scenario's name: {name!r}")
    return check_scenario_name(scenario), stamp


def archived_at(stamp: str) -> str:
    """The stamp as ISO 8601 (UTC)."""
    moment = datetime.strptime(stamp, "%Y%m%dT%H%M%S%fZ").replace(tzinfo=timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
