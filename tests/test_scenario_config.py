"""Revisioned runtime config and training modes: `GET/POST /reef/scenarios/{s}/config` (ETag,
If-Match, 412, 428, the allow-list), `POST /reef/scenarios/{s}/update`, through a real `reef serve`
on a scripted upstream with the `skills` recipe; the settings steps in both commit logs (JSONL and
PostgreSQL) read back after a reopen; and a live gate threshold the learner reads at its next
candidate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator
from uuid import uuid4

import httpx
import pytest
from click.testing import CliRunner

from reef.cli import main
from reef.commit.scenario_settings import (
    StaleRevision,
    change_settings,
    log_instruction,
    request_train_now,
    settings_of,
)
from reef.commit.state import ReefState
from reef.config import GateConfig
from reef.core.errors import InvalidInput, StaleHead
from reef.core.types import Operation
from reef.grow.canary import CanaryLoop
from reef.grow.learner_stats import LearnerStats
from reef.grow.live_settings import LiveBase, check_changes, effective
from reef.grow.steering import Steering
from reef.recipes.sao import SAOConfig, SAORecipe
from reef.recipes.skills import SkillsConfig
from tests.helpers.reef_server import ReefServer
from tests.pg import postgres_dsn  # noqa: F401  (session fixture)
from tests.scripted_upstream import ScriptedUpstream
from tests.test_harness_learning import CHATTY, GOOD, RULE_MARKER, ask, settings, wait_for, write_tasks

CONFIG = "/reef/scenarios/fmt/config"


@pytest.fixture
def model() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as upstream:
        upstream.answer_by_system({RULE_MARKER: GOOD}, otherwise=CHATTY)
        yield upstream


def steps(reef: ReefServer, http: httpx.Client) -> int:
    return int(http.get(f"{reef.url}/reef/scenarios/fmt").json()["step"])


def test_config_changes_need_the_current_revision_and_survive_a_restart(
    model: ScriptedUpstream, tmp_path: Path
) -> None:
    config = settings(model, write_tasks(tmp_path / "tasks.jsonl"))
    with ReefServer(tmp_path, config) as reef, httpx.Client(timeout=30) as http:
        ask(reef)  # creates the scenario, bound to skills
        first = http.get(f"{reef.url}{CONFIG}")
        assert first.status_code == 200 and first.headers["etag"] == '"0"'
        view = first.json()
        assert view["training_mode"] == "auto" and view["live"] == {"batch_size": 8, "gate_margin": 1}
        assert view["recipe_settings"]["llm"]["api_key"] is None  # a secret never shows
        before = steps(reef, http)

        missing = http.post(f"{reef.url}{CONFIG}", json={"batch_size": 3})
        assert missing.status_code == 428 and "If-Match" in missing.json()["error"]["message"]
        for bad, named in (({"lora_r": 4}, "lora_r"), ({"batch_size": 0}, "batch_size"), ({"lr": 0.1}, "lr")):
            refused = http.post(f"{reef.url}{CONFIG}", json=bad, headers={"if-match": '"0"'})
            assert refused.status_code == 400 and named in refused.json()["error"]["message"], refused.text
        assert (
            http.post(
                f"{reef.url}{CONFIG}", json={"training_mode": "sometimes"}, headers={"if-match": '"0"'}
            ).status_code
            == 400
        )
        assert steps(reef, http) == before  # nothing refused was logged

        changed = http.post(
            f"{reef.url}{CONFIG}", json={"batch_size": 3, "training_mode": "hybrid"}, headers={"if-match": '"0"'}
        )
        assert changed.status_code == 200, changed.text
        etag = changed.headers["etag"]
        assert etag != '"0"' and changed.json()["live"]["batch_size"] == 3
        assert changed.json()["history"][-1]["changes"] == {"training_mode": "hybrid", "batch_size": 3}

        stale = http.post(f"{reef.url}{CONFIG}", json={"batch_size": 5}, headers={"if-match": '"0"'})
        assert stale.status_code == 412 and stale.headers["etag"] == etag
        assert http.get(f"{reef.url}{CONFIG}").json()["live"]["batch_size"] == 3

        mode = http.post(f"{reef.url}/reef/scenarios/fmt/update", json={"training_mode": "manual", "why": "x"})
        assert mode.status_code == 400 and "why" in mode.json()["error"]["message"]
        mode = http.post(f"{reef.url}/reef/scenarios/fmt/update", json={"training_mode": "manual"})
        assert mode.status_code == 200 and mode.json()["training_mode"] == "manual"
        again = http.post(f"{reef.url}/reef/scenarios/fmt/update", json={"training_mode": "manual"})
        assert again.json()["revision"] == mode.json()["revision"]  # the same mode again logs nothing
        etag = http.get(f"{reef.url}{CONFIG}").headers["etag"]

    with ReefServer(tmp_path, config) as reef, httpx.Client(timeout=30) as http:
        after = http.get(f"{reef.url}{CONFIG}")
        assert after.headers["etag"] == etag
        assert after.json()["training_mode"] == "manual" and after.json()["live"]["batch_size"] == 3
        assert http.get(f"{reef.url}/reef/scenarios/fmt").json()["training_mode"] == "manual"
        learner = wait_for(lambda: _learner(reef, http), what="the learner")
        assert learner["training_mode"] == "manual" and learner["settings_revision"] == int(etag.strip('"'))


def test_a_live_gate_margin_reaches_the_next_candidate(model: ScriptedUpstream, tmp_path: Path) -> None:
    """With the margin raised past what 4 tasks can show, the instruction's candidate, which the
    config's margin (1) would publish, is rejected: the learner read the live value. Through the
    `reef config set` and `reef train` commands."""
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    with ReefServer(tmp_path, settings(model, tasks)) as reef:
        ask(reef)
        cli = CliRunner()
        raised = cli.invoke(main, ["config", "set", "fmt", "gate_margin=10", "training_mode=hybrid", "--url", reef.url])
        assert raised.exit_code == 0, raised.output
        assert json.loads(raised.output)["live"]["gate_margin"] == 10
        given = cli.invoke(main, ["train", "fmt", "Answer with a single word only.", "--wait", "60", "--url", reef.url])
        assert given.exit_code == 0, given.output
        done = json.loads(given.output)
        assert done["state"] == "rejected" and done["verdict"]["metrics"]["margin"] == 10, done
        refused = cli.invoke(main, ["config", "set", "fmt", "lora_r=4", "--url", reef.url])
        assert refused.exit_code != 0 and "lora_r" in refused.output


def _learner(reef: ReefServer, http: httpx.Client) -> dict[str, Any] | None:
    learners = http.get(f"{reef.url}/reef/status").json()["learning"]["learners"]
    return next((s for s in learners if s["scenario"] == "fmt"), None)


def _jsonl(tmp_path: Path) -> Iterator[Callable[[], ReefState]]:
    yield lambda: ReefState.open(tmp_path / "state")


@pytest.fixture(params=["jsonl", "postgresql"])
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], ReefState]]:
    """Opens the same state again: a state directory (JSONL logs), or one on PostgreSQL."""
    if request.param == "jsonl":
        yield lambda: ReefState.open(tmp_path / "state")
        return
    pytest.importorskip("psycopg")
    dsn = request.getfixturevalue("postgres_dsn")
    from reef.observe.postgres_store import PostgresStore

    schema = f"t_{uuid4().hex[:12]}"
    yield lambda: ReefState.open(tmp_path / "state", store=PostgresStore(dsn, schema=schema, pool_size=2))


def test_both_commit_logs_carry_settings_instructions_and_train_now(reopen: Callable[[], ReefState]) -> None:
    with reopen() as state:
        chain = state.create("s", recipe="skills")
        changed = change_settings(chain, {"training_mode": "manual", "batch_size": 2}, expected_revision=0)
        with pytest.raises(StaleRevision):
            change_settings(chain, {"batch_size": 4}, expected_revision=0)
        log_instruction(chain, "i-1", "answer in one line", ["r-1"])
        assert log_instruction(chain, "i-1", "answer in one line", ["r-1"]).step == 3  # a retry logs nothing
        request_train_now(chain)
        last = chain.last_step()
    with reopen() as state:
        chain = state.chain("s")
        read = settings_of(chain)
        assert chain.last_step() == last and read.revision == changed.revision
        assert (read.training_mode, read.live, read.train_now) == ("manual", {"batch_size": 2}, last)
        assert [(i.id, i.text, i.references) for i in read.instructions] == [("i-1", "answer in one line", ("r-1",))]
        assert [e.operation for e in chain.history()][1:] == [
            Operation.SETTINGS,
            Operation.INSTRUCTION,
            Operation.TRAIN_NOW,
        ]
        assert chain.head().step == 1  # notes move no release
        # a learner that read the step before an operator's note still logs its batch; not across a batch
        chain.begin_batch("b-1", ["r-1"], ["p-1"], high_water=0, expected_step=1)
        with pytest.raises(StaleHead):
            chain.begin_batch("b-2", ["r-2"], ["p-2"], high_water=0, expected_step=1, max_open=2)


def test_the_learner_reads_live_settings_at_its_next_step(tmp_path: Path) -> None:
    """What a weights learner's steering makes of a logged change: the recipe's lr and batch size
    for its next batch and candidate, the gate's thresholds for its next candidate, the mode."""
    with ReefState.open(tmp_path / "state") as state:
        chain = state.create("w", recipe="sao")
        recipe = SAORecipe(SAOConfig())
        steering = Steering(recipe, CanaryLoop("w", None, None, LearnerStats()))
        steering.refresh(chain.history())
        assert recipe.train_config().lr == SAOConfig().lr and steering.gate_overrides == {}
        live = {"lr": 0.002, "batch_size": 2, "gate_margin": 0.1, "gate_confidence": 0.9, "canary_fraction": 0.05}
        live["training_mode"] = "manual"
        change_settings(chain, live, expected_revision=0)
        steering.refresh(chain.history())
        assert recipe.train_config().lr == 0.002 and recipe.candidate_size == 2 * SAOConfig().steps_per_candidate
        assert steering.gate_overrides == {"margin": 0.1, "confidence": 0.9}
        assert steering.canary.fraction == 0.05  # its next candidate's canary
        assert not steering.may_ask()  # manual, and sao takes no instructions: no batch from traffic
        request_train_now(chain)
        steering.refresh(chain.history())
        assert steering.from_traffic() and steering.status()["train_now_pending"] is True


def test_the_live_allow_list_checks_each_value_against_its_bounds() -> None:
    weights = LiveBase("weights", SAOConfig(), GateConfig(), 0.05, 0.1)
    assert check_changes(weights, {"canary_fraction": 0.08, "lr": 1e-4}) == {"canary_fraction": 0.08, "lr": 1e-4}
    for bad, named in (
        ({"canary_fraction": 0.2}, "canary_max_fraction"),
        ({"lr": -1.0}, "lr"),
        ({"gate_confidence": 1.5}, "confidence"),
        ({"batch_size": True}, "number"),
        ({"lora_r": 4}, "lora_r"),
    ):
        with pytest.raises(InvalidInput, match=named):
            check_changes(weights, bad)
    harness = LiveBase("harness", SkillsConfig(), GateConfig(), 0.05, 0.1)
    assert harness.supported() == ["batch_size", "gate_margin"]  # no lr, no canary: nothing trains weights
    assert effective(harness, {"gate_margin": 3}) == {"batch_size": 8, "gate_margin": 3}
