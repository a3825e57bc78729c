"""The whole weights loop on the tiny model through a real `reef serve`: records, reports,
logged batch, LoRA steps in the training process, gate, publish, hot swap; requests during
swaps; two scenarios at once; a SIGKILL during training."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import openai
import pytest

from reef.client import ReefClient
from reef.commit.state import ReefState
from reef.core.types import Operation
from tests.helpers.reef_server import ReefServer


def settings(model_dir: Path, **learner: Any) -> dict[str, Any]:
    return {
        "embedded": {"model_dir": str(model_dir), "default_max_tokens": 8, "threads": 1},
        "learner": {
            "poll_interval": 0.1,
            "train_threads": 1,
            "sao": {"batch_size": 4, "steps_per_candidate": 1, "lr": 0.01, "max_staleness": 5},
            # a generous offline bound: these tests are about the mechanics, not the gate's taste
            "gate": {"holdout_fraction": 0.3, "offline_bound": 1000.0},
            **learner,
        },
    }


def wait_for(condition: Callable[[], Any], timeout: float = 120.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def ask_and_report(
    reef: ReefServer, scenario: str, n: int, score: Callable[[int], float] = lambda i: float(i % 2)
) -> list[str]:
    oai = openai.OpenAI(base_url=reef.base_url, api_key="x", max_retries=0, timeout=60)
    receipts = []
    with ReefClient(reef.url) as client:
        for i in range(n):
            raw = oai.chat.completions.with_raw_response.create(
                model="m",
                messages=[{"role": "user", "content": f"Say {i}."}],
                temperature=1.0,
                extra_headers={"x-reef-scenario": scenario},
            )
            receipts.append(raw.headers["x-reef-agent-record-id"])
            client.report(receipts[-1], score=score(i))
    return receipts


def feed_until(reef: ReefServer, scenario: str, condition: Callable[[], Any], max_requests: int = 120) -> Any:
    """Send scored traffic in small rounds until `condition()` holds (the learner's pace varies)."""
    for _ in range(0, max_requests, 4):
        ask_and_report(reef, scenario, 4)
        value = condition()
        if value:
            return value
    return wait_for(condition, timeout=60, what=f"learning in {scenario}: {learner_status(reef, scenario)}")


def learner_status(reef: ReefServer, scenario: str) -> Any:
    with ReefClient(reef.url) as client:
        return [s for s in client.status()["learning"]["learners"] if s["scenario"] == scenario]


def decisions(reef: ReefServer, scenario: str) -> list[dict[str, Any]]:
    with ReefClient(reef.url) as client:
        return client._call("GET", f"/reef/scenarios/{scenario}/decisions")["decisions"]  # noqa: SLF001


@pytest.fixture(scope="module")
def reef(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    with ReefServer(tmp_path_factory.mktemp("reef-learn"), settings(tiny_model_dir)) as server:
        yield server


def test_the_whole_loop_publishes_and_swaps(reef: ReefServer) -> None:
    published = feed_until(
        reef, "loop", lambda: [d for d in decisions(reef, "loop") if d["verdict"]["decision"] == "select"]
    )
    release_id = published[0]["release_id"]
    with ReefClient(reef.url) as client:
        head = client.releases("loop")["releases"][0]["release_id"]
        # the learner keeps going: the head may be a later selection than `published` saw
        assert head in {d["release_id"] for d in decisions(reef, "loop") if d["verdict"]["decision"] == "select"}
        wait_for(
            lambda: any(
                s["scenario"] == "loop" and s["published"] >= 1 for s in client.status()["learning"]["learners"]
            ),
            what="the learner's count",
        )
        new = ask_and_report(reef, "loop", 1)[0]
        record = client.record(new)["record"]
    assert record["release"]["release_id"] != release_id or record["release"]["runtime_load_id"]
    with ReefClient(reef.url) as client:
        serving = client.scenario("loop")["serving"]
        # the learner keeps going: a later candidate may have been published meanwhile
        assert serving["release_id"] in {
            d["release_id"] for d in decisions(reef, "loop") if d["verdict"]["decision"] == "select"
        }
        first = client.releases("loop")["releases"][-1]
        back = client.rollback("loop", first["release_id"])  # weights back to the base, as a new release
        assert back["serving"]["content_id"] == first["content_id"]
        assert back["serving"]["runtime_load_id"] != serving["runtime_load_id"]
        receipt = ask_and_report(reef, "loop", 1)[0]
        served = client.record(receipt)["record"]["release"]["release_id"]
        chain = [r["release_id"] for r in client.releases("loop")["releases"]]  # newest first
        assert chain.index(served) <= chain.index(back["release"]["release_id"])  # the rollback or newer


def test_requests_during_swaps_all_succeed_on_their_admitted_release(reef: ReefServer) -> None:
    oai = openai.OpenAI(base_url=reef.base_url, api_key="x", max_retries=0, timeout=120)
    stop = time.monotonic() + 60

    def traffic(worker: int) -> list[tuple[str, str]]:
        seen = []
        while time.monotonic() < stop:
            raw = oai.chat.completions.with_raw_response.create(
                model="m",
                messages=[{"role": "user", "content": f"w{worker}"}],
                extra_headers={"x-reef-scenario": "swap"},
            )
            raw.parse()
            seen.append((raw.headers["x-reef-agent-record-id"], raw.headers["x-reef-release-id"]))
            if len(decisions(reef, "swap")) >= 2:
                break
        return seen

    with ThreadPoolExecutor(3) as pool:
        feeder = pool.submit(feed_until, reef, "swap", lambda: len(decisions(reef, "swap")) >= 2)
        results = [pool.submit(traffic, w) for w in range(2)]
        feeder.result()
        seen = [pair for r in results for pair in r.result()]
    assert seen, "traffic ran"
    with ReefClient(reef.url) as client:
        for receipt, release_id in seen:
            record = client.record(receipt)["record"]
            assert record["status"] == "complete" and record["release"]["release_id"] == release_id
            assert {s["runtime_load_id"] for s in record["spans"]} == {record["release"]["runtime_load_id"]}


def test_two_scenarios_train_at_once_with_separate_chains(reef: ReefServer) -> None:
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda s: feed_until(reef, s, lambda: decisions(reef, s)), ["left", "right"]))
    with ReefClient(reef.url) as client:
        left = {r["release_id"] for r in client.releases("left")["releases"]}
        right = {r["release_id"] for r in client.releases("right")["releases"]}
    assert not left & right


def test_a_batch_logged_before_a_crash_is_resumed_after_restart(tiny_model_dir: Path, tmp_path: Path) -> None:
    quiet = settings(tiny_model_dir)
    quiet["learner"]["enabled"] = False
    with ReefServer(tmp_path, quiet) as server:
        receipts = ask_and_report(server, "crash", 4)
    with ReefState.open(server.state_dir) as state:  # what the learner logs before training, then "crashes"
        chain = state.chain("crash")
        chain.begin_batch("b-before-crash", receipts, [], high_water=4, expected_step=chain.last_step())
    with ReefServer(tmp_path, settings(tiny_model_dir)) as restarted:
        wait_for(lambda: _batch_closed(restarted), what="the logged batch to be resumed")
    history = _history(restarted)
    closer = next(e for e in history if e.metrics.get("batch_id") == "b-before-crash")
    assert closer.operation in (Operation.TRAINING, Operation.REJECTION)  # resumed, trained, judged
    _assert_no_record_trained_twice(history)


def test_a_batch_whose_records_are_gone_is_abandoned_and_logged(tiny_model_dir: Path, tmp_path: Path) -> None:
    quiet = settings(tiny_model_dir)
    quiet["learner"]["enabled"] = False
    with ReefServer(tmp_path, quiet) as server:
        ask_and_report(server, "crash", 1)
    with ReefState.open(server.state_dir) as state:
        chain = state.chain("crash")
        chain.begin_batch("b-lost", ["no-such-record"], [], high_water=1, expected_step=chain.last_step())
    with ReefServer(tmp_path, settings(tiny_model_dir)) as restarted:
        wait_for(lambda: _batch_closed(restarted), what="the batch to be abandoned")
    abandon = [e for e in _history(restarted) if e.operation is Operation.ABANDON]
    assert abandon and abandon[0].metrics["batch_id"] == "b-lost" and "no-such-record" in abandon[0].metrics["reason"]


def test_a_sigkill_while_learning_keeps_every_batch_accounted_for(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = ReefServer(tmp_path, settings(tiny_model_dir)).start()
    try:
        ask_and_report(server, "crash", 10)
        server.kill()  # wherever the learner is: collecting, training or judging
    finally:
        server.stop()
    with ReefServer(tmp_path, settings(tiny_model_dir)) as restarted:
        ask_and_report(restarted, "crash", 4)
        wait_for(lambda: _batch_closed(restarted), what="no batch left open")
    _assert_no_record_trained_twice(_history(restarted))


def _history(server: ReefServer) -> list[Any]:
    with ReefState.open(server.state_dir) as state:
        return state.chain("crash").history()


def _assert_no_record_trained_twice(history: list[Any]) -> None:
    batches = [e.batch for e in history if e.operation is Operation.BATCH]
    trained = [rid for b in batches for rid in b["record_ids"]]
    assert len(trained) == len(set(trained)), "a record was put in two batches"


def _batch_closed(server: ReefServer) -> bool:
    with ReefClient(server.url) as client:
        return client.scenario("crash")["learner"]["open_batch"] is None
