"""Training instructions and modes through a real `reef serve` on a scripted upstream: `POST
/reef/train` gives a receipt, the `skills` learner turns the instruction into a rule the gate
publishes, `GET /reef/train/{id}` follows it to the release; bad instructions are refused with
nothing stored; `manual` mode reads reports but trains only on `train-now`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from reef.client import ReefClient
from reef.commit.state import ReefState
from reef.observe.export import examples
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream
from tests.test_harness_learning import (
    CHATTY,
    FEEDBACK,
    GOOD,
    RULE_MARKER,
    ask,
    fail_with,
    settings,
    wait_for,
    write_tasks,
)

INSTRUCTION = "Answer with a single word only."
ORDER = ["queued", "candidate", "judged", "published"]


@pytest.fixture
def model() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as upstream:
        upstream.answer_by_system({RULE_MARKER: GOOD}, otherwise=CHATTY)
        yield upstream


def learner(reef: ReefServer, http: httpx.Client) -> dict[str, Any] | None:
    learners = http.get(f"{reef.url}/reef/status").json()["learning"]["learners"]
    return next((s for s in learners if s["scenario"] == "fmt"), None)


def stored(reef: ReefServer, http: httpx.Client) -> tuple[int, int, int]:
    """Records, reports and commit-log steps: what a refused request must leave as it was."""
    storage = http.get(f"{reef.url}/reef/status").json()["storage"]
    steps = http.get(f"{reef.url}/reef/scenarios/fmt").json()["step"]
    return storage["records"], storage["reports"], steps


def test_an_instruction_becomes_a_rule_the_gate_publishes(model: ScriptedUpstream, tmp_path: Path) -> None:
    with (
        ReefServer(tmp_path, settings(model, write_tasks(tmp_path / "tasks.jsonl"))) as reef,
        httpx.Client(timeout=30) as http,
    ):
        assert ask(reef)[2] == CHATTY
        body = {"scenario": "fmt", "instruction": INSTRUCTION}
        refused = http.post(f"{reef.url}/reef/train", json=body)
        assert refused.status_code == 409 and "auto mode" in refused.json()["error"]["message"]
        http.post(f"{reef.url}/reef/scenarios/fmt/update", json={"training_mode": "hybrid"}).raise_for_status()

        given = http.post(f"{reef.url}/reef/train", json=body, headers={"x-reef-agent-record-id": "instr-1"})
        assert given.status_code == 200, given.text
        assert given.headers["x-reef-agent-record-id"] == "instr-1" and given.json()["state"] in ORDER
        seen: list[str] = []

        def published() -> dict[str, Any] | None:
            now = http.get(f"{reef.url}/reef/train/instr-1").json()
            if not seen or seen[-1] != now["state"]:
                seen.append(now["state"])
            return now if now["state"] in ("published", "rejected") else None

        done = wait_for(published, what="the instruction's release")
        assert done["state"] == "published" and seen == sorted(seen, key=ORDER.index), seen
        with ReefClient(reef.url) as client:
            assert done["release_id"] == client.releases("fmt")["head"]
            harness = client.harness("fmt")
        assert INSTRUCTION in harness["system_prompt"]
        assert ask(reef)[2] == GOOD  # requests carry the rule now

        again = http.post(f"{reef.url}/reef/train", json=body, headers={"x-reef-agent-record-id": "instr-1"})
        assert again.status_code == 200 and again.json()["state"] == "published"  # a retry: the same instruction
        other = http.post(
            f"{reef.url}/reef/train",
            json={**body, "instruction": "Be chatty."},
            headers={"x-reef-agent-record-id": "instr-1"},
        )
        assert other.status_code == 409
        status = wait_for(lambda: learner(reef, http), what="the learner status")
        assert status["training_mode"] == "hybrid"
        assert status["instructions"] == [
            {
                "instruction_id": "instr-1",
                "state": "published",
                "batch_id": done["batch_id"],
                "release_id": done["release_id"],
                "verdict": done["verdict"],
            }
        ]
        history = [e for e in http.get(f"{reef.url}/reef/scenarios/fmt/config").json()["history"]]
        assert history[-1]["changes"] == {"training_mode": "hybrid"}
    with ReefState.open(reef.state_dir) as state:  # a chat dataset holds exchanges, not instructions
        exported = [row["metadata"]["record_id"] for row in examples(state.store, "fmt")]
        assert exported and "instr-1" not in exported


def test_manual_mode_refuses_bad_instructions_reads_reports_and_trains_only_when_asked(
    model: ScriptedUpstream, tmp_path: Path
) -> None:
    config = settings(model, write_tasks(tmp_path / "tasks.jsonl"))
    config["recipes"]["scenarios"]["weights"] = "sao"  # a weights recipe: idle on an upstream, bound all the same
    with ReefServer(tmp_path, config) as reef, httpx.Client(timeout=30) as http:
        receipt, _, _ = ask(reef)
        assert http.post(f"{reef.url}/reef/scenarios/fmt/train-now", json={}).status_code == 409  # auto: nothing to ask
        http.post(f"{reef.url}/reef/scenarios/fmt/update", json={"training_mode": "manual"}).raise_for_status()
        created = http.post(f"{reef.url}/reef/scenarios", json={"name": "weights", "recipe": "sao"})
        assert created.status_code == 201, created.text
        refuse_bad_instructions(reef, http, receipt)

        fail_with(reef, FEEDBACK)  # a theme that recurs 3 times: auto mode would make a rule of it now
        idle = wait_for(
            lambda: (s := learner(reef, http)) and s["waiting_failures"] == len(FEEDBACK) and s,
            what="the learner to read the reports",
        )
        assert idle["batches"] == 0 and idle["train_now_pending"] is False
        asked = http.post(f"{reef.url}/reef/scenarios/fmt/train-now", json={})
        assert asked.status_code == 200 and asked.json()["requested_at_step"] > 0, asked.text
        wait_for(lambda: (s := learner(reef, http)) and s["published"] == 1, what="the asked-for batch to publish")
        assert learner(reef, http)["train_now_pending"] is False


def refuse_bad_instructions(reef: ReefServer, http: httpx.Client, receipt: str) -> None:
    """Each refused with a clear error naming what is wrong, and nothing stored or logged."""
    before = stored(reef, http)
    cases = [
        ({"scenario": "fmt", "instruction": INSTRUCTION, "priority": 1}, 400, "priority"),
        ({"scenario": "fmt", "instruction": "   "}, 400, "blank"),
        ({"scenario": "fmt"}, 400, "instruction"),
        ({"scenario": "nope", "instruction": INSTRUCTION}, 404, "nope"),
        ({"scenario": "fmt", "instruction": INSTRUCTION, "references": ["no-such-receipt"]}, 404, "no-such-receipt"),
        ({"scenario": "weights", "instruction": INSTRUCTION}, 409, "takes no instructions"),
    ]
    for body, status, named in cases:
        answer = http.post(f"{reef.url}/reef/train", json=body)
        assert answer.status_code == status and named in answer.json()["error"]["message"], (body, answer.text)
    taken = http.post(
        f"{reef.url}/reef/train",
        json={"scenario": "fmt", "instruction": INSTRUCTION},
        headers={"x-reef-agent-record-id": receipt},
    )
    assert taken.status_code == 409  # a receipt of an exchange is not an instruction's
    assert http.get(f"{reef.url}/reef/train/{receipt}").status_code == 404  # an exchange is not an instruction
    assert http.post(f"{reef.url}/reef/scenarios/fmt/train-now", json={"now": True}).status_code == 400
    assert stored(reef, http) == before
