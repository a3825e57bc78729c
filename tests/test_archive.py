"""Archiving a scenario: `DELETE /reef/scenarios/{name}` moves its records, commit log and
artifact ref aside (nothing deleted), stops its learner and serving; `reef inspect` lists it;
the name is free for a new scenario under today's rules. A real server (a child process, the
scripted upstream), real git, real SQLite; the state part on SQLite and a real PostgreSQL."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator
from uuid import uuid4

import httpx
import pytest
from click.testing import CliRunner

from reef.cli import main
from reef.commit.archive import archive_scenario, archived_scenarios
from reef.commit.state import ReefState
from reef.core.errors import NotFound
from reef.core.types import Record, RecordStatus, Report
from reef.observe.store import ExperienceStore
from tests.helpers.reef_server import ReefServer
from tests.pg import postgres_dsn  # noqa: F401  (session fixture used by the postgres param)
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "archive-token-41ad"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def settings(upstream: ScriptedUpstream, state_dir: Path) -> dict[str, Any]:
    """Two servers on one state directory (`shared_state_dir`), as workers share one."""
    return {
        "tokens": [TOKEN],
        "state_dir": str(state_dir),
        "shared_state_dir": True,
        "recipes": {"default": "skills"},
        "limits": {"max_scenarios": 1},
        "upstream": {"url": upstream.base_url, "model": "provider-model", "timeout": 5},
    }


def poll(condition: Callable[[], Any], what: str, deadline_s: float = 20.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} in {deadline_s}s"
        time.sleep(0.05)


def learners(http: httpx.Client) -> list[str]:
    return [row["scenario"] for row in http.get("/reef/status").json()["learning"]["learners"]]


def ask(http: httpx.Client, scenario: str) -> httpx.Response:
    return http.post("/v1/chat/completions", json=CHAT, headers={"x-reef-scenario": scenario})


def test_an_archived_scenario_is_kept_aside_and_its_name_starts_afresh(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with (
        ReefServer(tmp_path / "a", settings(upstream, state)) as reef,
        httpx.Client(base_url=reef.url, headers=AUTH) as http,
    ):
        receipts = [ask(http, "old").headers["x-reef-agent-record-id"] for _ in range(2)]
        assert http.post("/reef/report", json={"references": receipts[:1], "score": 1.0}).status_code == 200
        poll(lambda: "old" in learners(http), "learner of the scenario")
        assert ask(http, "other").status_code == 403  # limits.max_scenarios: 1
        other = ReefServer(tmp_path / "b", settings(upstream, state)).start()  # another process on the state
        beside = httpx.Client(base_url=other.url, headers=AUTH)
        assert ask(beside, "old").status_code == 200  # it serves the scenario too

        assert httpx.delete(f"{reef.url}/reef/scenarios/old").status_code == 401  # the token, like any write
        assert http.delete("/reef/scenarios/nope").status_code == 404
        assert http.delete("/reef/scenarios/bad name!").status_code == 400
        assert http.get("/reef/scenarios/old").json()["records"] == 3  # none of those changed anything
        gone = http.delete("/reef/scenarios/old")
        assert gone.status_code == 200, gone.text
        archived = gone.json()["archived"]
        assert archived["scenario"] == "old" and archived["archived_as"].startswith("archived/old/")
        assert archived["records"] == 3 and archived["steps"] >= 1
        assert http.get("/reef/scenarios/old").status_code == 404
        assert "old" not in learners(http)
        poll(lambda: beside.get("/reef/scenarios/old").status_code == 404, "let go by the other process")
        other.stop()
        assert http.delete("/reef/scenarios/old").status_code == 404
        kept = http.get(f"/reef/records/{receipts[0]}").json()  # nothing deleted
        assert [r["score"] for r in kept["reports"]] == [1.0]

        again = ask(http, "old")  # the name is free: a new scenario, empty, at step 1
        assert again.status_code == 200, again.text
        fresh = http.get("/reef/scenarios/old").json()
        assert (fresh["step"], fresh["records"], fresh["reports"]) == (1, 1, 0)
        assert fresh["head"]["release_id"] != archived["head_release_id"]
        assert http.post("/reef/report", json={"references": receipts[1:], "score": 0.0}).status_code == 404

    refs = subprocess.run(
        ["git", "--git-dir", str(state / "artifacts.git"), "for-each-ref", "--format=%(objectname)", "refs/reef/archived/"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert refs == [archived["head_release_id"]]
    shown = CliRunner().invoke(main, ["inspect", "--state-dir", str(state)])
    assert shown.exit_code == 0, shown.output
    assert f"archived: old as {archived['archived_as']}" in shown.output and "3 records, 1 reports" in shown.output
    assert "old: step 1" in shown.output


# -- the state, on both backends ----------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def open_state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    opened: list[ReefState] = []
    schema = f"t_{uuid4().hex[:12]}"

    def opener() -> ReefState:
        store: ExperienceStore | None = None
        if request.param == "postgres":
            from reef.observe.postgres_store import PostgresStore

            store = PostgresStore(request.getfixturevalue("postgres_dsn"), schema=schema)
        opened.append(ReefState.open(tmp_path / "state", store=store))
        return opened[-1]

    yield opener
    for state in opened:
        state.close()
        if state.store is not None and request.param == "postgres":
            state.store.close()


def test_archive_moves_records_log_and_ref_aside_and_survives_a_reopen(open_state: Any) -> None:
    state: ReefState = open_state()
    chain = state.create("s", "skills")
    record = Record("r-1", "s", chain.head().ref, {"messages": []}, RecordStatus.COMPLETE, response={"text": "a"})
    state.store.put_record(record)
    state.store.put_report(Report("p-1", "s", ("r-1",), 1.0))

    done = archive_scenario(state, "s")
    assert done.records == 1 and done.steps == 1
    assert state.scenarios() == [] and state.store.count_records("s") == 0
    assert state.store.count_records(done.archived_as) == 1 and state.store.count_reports(done.archived_as) == 1
    assert state.store.get_record("r-1") == state.store.get_record("r-1")  # still there, unchanged
    assert state.artifacts.scenario_head("s") is None
    with pytest.raises(NotFound):
        state.chain("s")
    state.close()

    reopened: ReefState = open_state()  # recovery reads no archived log as a scenario
    assert reopened.scenarios() == []
    assert [(a.scenario, a.archived_as, a.steps) for a in archived_scenarios(reopened)] == [("s", done.archived_as, 1)]
    again = reopened.create("s", "skills")
    assert again.last_step() == 1 and reopened.scenarios() == ["s"]
