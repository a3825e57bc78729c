"""`reef demo`: its verifier, its task split, its learning curve, and one real run."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import yaml

from reef.demo import tasks as demo_tasks
from reef.demo.curve import plot_learning_curve, rolling_success, success_on_test, write_curve
from reef.demo.tasks import gate_score, score, success
from reef.observe.sqlite_store import SQLiteStore

HOT = {"question": "What is the opposite of hot?", "answers": ["cold"], "category": "opposite"}
SUM = {"question": "What is 3 plus 4?", "answers": ["7", "seven"], "category": "arithmetic"}


# -- the verifier --------------------------------------------------------------------------------


@pytest.mark.parametrize("reply", ["cold", "Cold", "COLD.", " cold\n", "\tCold!", " cold. "])
def test_an_exact_answer_scores_one_whatever_its_case_spacing_or_final_stop(reply: str) -> None:
    assert score(HOT, reply) == 1.0
    assert success(HOT, reply)


def test_every_accepted_answer_counts_and_digits_are_answers() -> None:
    assert score(SUM, "7") == 1.0 and score(SUM, "Seven.") == 1.0
    assert score(SUM, "8") == 0.0


def test_the_answer_inside_a_short_sentence_gets_partial_credit() -> None:
    assert score(HOT, "The opposite of hot is cold.") == 0.25
    assert score(SUM, "3 + 4 = 7") == 0.25
    assert not success(HOT, "The opposite of hot is cold.")


def test_a_truncated_reply_scores_zero_even_when_it_is_the_answer() -> None:
    assert score(HOT, "cold", "length") == 0.0
    assert score(HOT, "The opposite of hot is cold", "length") == 0.0
    assert not success(HOT, "cold", "length")


def test_long_rambling_and_wrong_answers_score_zero() -> None:
    rambling = "Well, that depends on the season, the weather and what you think hot means, but usually it is cold."
    assert score(HOT, rambling) == 0.0
    assert score(HOT, "warm") == 0.0
    assert score(HOT, "") == 0.0
    assert score(HOT, "coldness") == 0.0  # a whole word, not a substring


def test_repeating_the_answer_is_not_an_exact_answer() -> None:
    assert score(HOT, "cold cold cold") < 1.0
    assert score(HOT, "cold " * 20) == 0.0
    assert score(HOT, "cold.\ncold.") < 1.0


def test_gate_score_is_success_of_the_text_as_it_is() -> None:
    assert gate_score(HOT, " Cold.") == 1.0
    assert gate_score(HOT, "It is cold") == 0.0  # partial credit shapes training only
    assert gate_score(HOT, "hot") == 0.0
    assert gate_score(json.loads(json.dumps(demo_tasks.heldout_record(HOT))), "cold") == 1.0


# -- the task set and its split --------------------------------------------------------------------


def test_the_task_set_is_large_varied_and_well_formed() -> None:
    assert len(demo_tasks.TASKS) >= 300
    families = {t["category"] for t in demo_tasks.TASKS}
    assert families == {"opposite", "capital", "plural", "language"}
    for task in demo_tasks.TASKS:
        assert task["answers"] and all(a == a.strip().lower() and " " not in a for a in task["answers"])
        asked = set(re.findall(r"\w+", task["question"].lower()))
        assert not asked & set(task["answers"]), f"echoing the question would be an answer: {task}"
        assert score(task, task["answers"][0]) == 1.0
        assert demo_tasks.messages(task)[-1]["content"].startswith(task["question"])


def test_the_split_is_deterministic_disjoint_and_covers_every_family() -> None:
    parts = {
        name: [t["question"] for t in getattr(demo_tasks, f"{name}_tasks")()] for name in ("train", "heldout", "test")
    }
    train, heldout, test = (set(parts[n]) for n in ("train", "heldout", "test"))
    assert not train & heldout and not train & test and not heldout & test
    assert len(train) + len(heldout) + len(test) == len(demo_tasks.TASKS)
    assert 0.18 <= len(heldout) / len(demo_tasks.TASKS) <= 0.25 and 0.18 <= len(test) / len(demo_tasks.TASKS) <= 0.25
    families = {t["category"] for t in demo_tasks.TASKS}
    for name in parts:
        assert {t["category"] for t in getattr(demo_tasks, f"{name}_tasks")()} == families
    assert all(demo_tasks.is_heldout(q) for q in heldout) and not any(demo_tasks.is_heldout(q) for q in train | test)
    assert parts["heldout"] == [t["question"] for t in demo_tasks.heldout_tasks()]  # the same every call
    # and the same in another interpreter, whatever its hash seed
    import subprocess
    import sys

    code = (
        "from reef.demo.tasks import heldout_tasks, test_tasks\n"
        "for part in (heldout_tasks(), test_tasks()): print('|'.join(t['question'] for t in part))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert [line.split("|") for line in other.stdout.strip().splitlines()] == [parts["heldout"], parts["test"]]


def test_heldout_jsonl_round_trips_in_the_form_the_gate_reads(tmp_path: Path) -> None:
    path = demo_tasks.write_heldout_jsonl(tmp_path / "sub" / "heldout.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == len(demo_tasks.heldout_tasks())
    rows = demo_tasks.read_tasks_jsonl(path)
    for row, task in zip(rows, demo_tasks.heldout_tasks()):
        assert row["question"] == task["question"] and row["answers"] == task["answers"]
        assert row["messages"] == demo_tasks.messages(task)
        assert row["messages"][-1]["role"] == "user"
        assert gate_score(row, task["answers"][-1]) == 1.0


def test_the_number_of_worked_examples_is_a_setting(tmp_path: Path) -> None:
    for shown in range(len(demo_tasks.EXAMPLES) + 1):
        turns = demo_tasks.messages(HOT, shown)
        assert len(turns) == 2 * shown + 1 and turns[-1]["content"] == demo_tasks.user_prompt(HOT)
        assert [t["content"] for t in turns[1:-1:2]] == [a for _, a in demo_tasks.EXAMPLES[:shown]]
    rows = demo_tasks.read_tasks_jsonl(demo_tasks.write_heldout_jsonl(tmp_path / "h.jsonl", 1))
    assert all(len(row["messages"]) == 3 for row in rows)


def test_the_demo_trains_full_weights_on_ranks_when_asked(tmp_path: Path) -> None:
    import yaml

    from reef.config import load_config
    from reef.demo.server import FULL_LEARNING_RATE, demo_settings

    heldout = demo_tasks.write_heldout_jsonl(tmp_path / "h.jsonl", 1)
    assert "weights" not in demo_settings(tmp_path, heldout, 8000, None)["learner"]  # LoRA: Reef's default
    settings = demo_settings(tmp_path, heldout, 8000, None, weights="full", ranks=2)
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(settings))
    learner = load_config(tmp_path / "serve.yaml", env={}).learner
    assert (learner.weights, learner.ranks) == ("full", 2)
    assert learner.settings_for("sao").full_lr == FULL_LEARNING_RATE  # 0.02 x lr barely moved it


# -- the learning curve ---------------------------------------------------------------------------


def _synthetic_curve() -> dict:
    traffic = [
        {"minute": i / 20, "score": 1.0 if i % 4 == 0 else 0.25, "success": i % 4 == 0, "release_id": "r1"}
        for i in range(120)
    ]
    return {
        "heldout": [
            {"minute": 0.0, "success": 0.1, "score": 0.2, "release_id": "r1", "kind": "start"},
            {"minute": 2.5, "success": 0.3, "score": 0.4, "release_id": "r2", "kind": "published"},
            {"minute": 4.0, "success": 0.45, "score": 0.5, "release_id": "r3", "kind": "published"},
        ],
        "rejected": [{"minute": 3.1, "candidate_success": 0.2, "current_success": 0.3, "p_value": 0.7}],
        "traffic": traffic,
        "releases": [{"release_id": "r1", "requests": 120, "mean_score": 0.44, "success_rate": 0.25}],
        "test": {
            "start": {"release_id": "r1", "n": 8, "success": 0.125},
            "final": {"release_id": "r3", "n": 8, "success": 0.5},
        },
        "settings": {"examples": 1, "temperature": 1.0, "lr": 2e-4, "minutes": 6.0},
        "summary": {"minutes": 6.0},
    }


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    path = plot_learning_curve(_synthetic_curve(), tmp_path / "curve.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    empty = plot_learning_curve({"heldout": [], "traffic": []}, tmp_path / "empty.png")
    assert empty.read_bytes()[:4] == b"\x89PNG"


def test_write_curve_writes_json_and_png(tmp_path: Path) -> None:
    curve = _synthetic_curve()
    png, json_path = write_curve(curve, tmp_path / "out")
    assert png.name == "learning_curve.png" and png.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(json_path.read_text()) == curve


def test_the_final_test_is_drawn_when_it_was_asked_after_the_last_verdict() -> None:
    curve = _synthetic_curve()
    assert success_on_test(curve) == [(0.0, 0.125), (6.0, 0.5)]  # a curve without the minute: the traffic's end
    curve["test"]["final"]["minute"] = 6.8  # the gate judged the traffic's last candidate first
    assert success_on_test(curve) == [(0.0, 0.125), (6.8, 0.5)]


def test_rolling_success_is_a_windowed_rate() -> None:
    traffic = [{"minute": i, "success": i >= 4} for i in range(8)]
    rates = [r for _, r in rolling_success(traffic, window=4)]
    assert rates[0] == 0.0 and rates[3] == 0.0 and rates[-1] == 1.0 and rates[5] == 0.5


def _decision(step: int, decision: str, minute: float, stats, current: float, candidate: float) -> dict:
    operation = "training" if decision == "select" else "rejection"
    return {
        "step": step,
        "operation": operation,
        "release_id": f"rel{step}",
        "recorded_at": stats.started_wall + 60 * minute,
        "verdict": {
            "decision": decision,
            "metrics": {
                "gate": "tasks",
                "current_success": current,
                "candidate_success": candidate,
                "current_score": current,
                "candidate_score": candidate,
                "wins": 3,
                "losses": 1,
                "ties": 50,
                "n": 54,
                "p_value": 0.31,
            },
        },
    }


def test_gate_verdicts_become_the_heldout_curve_and_the_live_view_shows_them() -> None:
    from rich.console import Console

    from reef.demo.live import live_view
    from reef.demo.run import DemoStats

    stats = DemoStats(minutes=5)
    stats.record("rel1", 1.0, True)
    stats.record("rel1", 0.25, False)
    stats.decisions = [_decision(4, "reject", 2.0, stats, 0.25, 0.2), _decision(3, "select", 1.0, stats, 0.2, 0.25)]
    stats.learning = {"learners": [{"scenario": "demo", "state": "training", "pending_samples": 5, "candidates": 2}]}
    stats.test["start"] = {"release_id": "rel1", "n": 3, "success": 1 / 3}
    heldout, rejected = stats.heldout_points()
    assert [(p["kind"], p["success"]) for p in heldout] == [("start", 0.2), ("published", 0.25)]
    assert heldout[0]["release_id"] == "rel1" and heldout[1]["release_id"] == "rel3"
    assert abs(heldout[1]["minute"] - 1.0) < 1e-3
    assert rejected == [{"minute": 2.0, "candidate_success": 0.2, "current_success": 0.25, "p_value": 0.31}]
    assert stats.counts() == (1, 1)
    assert stats.releases() == [{"release_id": "rel1", "requests": 2, "mean_score": 0.625, "success_rate": 0.5}]
    out = io.StringIO()
    Console(file=out, width=160).print(live_view(stats))
    text = out.getvalue()
    assert (
        "1 published, 1 rejected" in text
        and "step 4: reject" in text
        and "training, 5 scored samples" in text
        and "2 candidate(s)" in text
    )
    assert "test success" in text and "33.3% at the start" in text


def test_traffic_goes_on_past_its_minutes_while_the_gate_judges_a_candidate() -> None:
    """A short demo's verdict lands while its traffic runs: past --minutes the traffic stops only
    once no canary serves (the gate is not judging), or the grace is spent."""
    import time

    from rich.console import Console

    from reef.demo.live import live_view
    from reef.demo.run import VERDICT_GRACE_MINUTES, DemoStats

    judging = {"learners": [{"scenario": "demo", "state": "training", "canary": {"running": True}}]}
    idle = {"learners": [{"scenario": "demo", "state": "training", "canary": {"running": False}}]}
    stats = DemoStats(minutes=2)
    assert stats.traffic_goes_on()  # within its minutes, whatever the gate does
    stats.started -= 2.5 * 60  # half a minute past them
    stats.learning = judging
    assert stats.traffic_goes_on()
    out = io.StringIO()
    Console(file=out, width=160).print(live_view(stats))
    assert "traffic goes on until the gate's verdict" in out.getvalue()
    stats.decisions = [{"step": 9, "verdict": {"decision": "reject"}}]  # the verdict landed
    assert not stats.traffic_goes_on()  # whether or not the gate goes on to judge the next candidate
    stats.decisions, stats.verdicts_at_minutes = [], None
    stats.learning = idle
    assert not stats.traffic_goes_on()
    stats.learning = {"learners": [{"scenario": "other", "canary": {"running": True}}]}
    assert not stats.traffic_goes_on()  # another scenario's canary is not the demo's verdict
    stats.learning = judging
    stats.started = time.monotonic() - (2 + VERDICT_GRACE_MINUTES) * 60
    assert not stats.traffic_goes_on()  # the grace is spent


def test_the_table_reports_the_test_questions_at_the_start_and_the_end() -> None:
    from rich.console import Console

    from reef.demo.curve import curve_table

    out = io.StringIO()
    Console(file=out, width=160).print(curve_table(_synthetic_curve()))
    text = " ".join(out.getvalue().split())  # the caption wraps at the table's width
    assert "never trained or selected on" in text and "12.5% at the start, 50.0% at the end (r3)" in text


# -- the whole demo ---------------------------------------------------------------------------------


def test_demo_runs_end_to_end_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rich.console import Console

    from reef.demo.run import VERDICT_GRACE_MINUTES, run_demo

    out = io.StringIO()
    result = run_demo(
        minutes=0.4,
        workdir=tmp_path / "work",
        model_dir=tiny_model_dir,
        concurrency=4,
        out_dir=tmp_path / "out",
        console=Console(file=out, width=120),
        temperature=0.5,
        lr=1e-4,
    )
    assert result.requests > 0, out.getvalue()
    assert result.reports > 0 and result.reports <= result.requests
    assert result.errors < result.requests
    curve = json.loads((tmp_path / "out" / "learning_curve.json").read_text())
    assert 0.3 <= result.minutes <= 0.45 + VERDICT_GRACE_MINUTES
    assert result.minutes <= 0.45 or curve["decisions"]  # past its minutes only while the gate judged
    assert len(curve["traffic"]) == result.reports and curve["summary"]["requests"] == result.requests
    assert sum(r["requests"] for r in curve["releases"]) == result.reports
    assert (tmp_path / "out" / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "out" / "serve.log").exists()
    assert "reef demo:" in out.getvalue()
    assert curve["settings"] == {
        "examples": demo_tasks.SHOWN_EXAMPLES,
        "temperature": 0.5,
        "lr": 1e-4,
        "minutes": 0.4,
        "runtime": "embedded",
        "canary": 0.1,
        "loss": "cispo",
    }
    config = yaml.safe_load((tmp_path / "work" / "serve.yaml").read_text())
    assert config["learner"]["sao"]["lr"] == 1e-4 and config["learner"]["canary"] == {"demo": 0.1}  # within the bound
    assert (
        config["learner"]["sao"]["loss"] == "cispo"
    )  # the demo's loss (the race's measure; sao's default too since 2026-12-02)
    assert config["learner"]["gate"]["live_split"] == 0.1  # with its canary, live scores as evidence, within the bound
    assert (
        config["learner"]["gate"]["halves"] == "after_first"
    )  # later heads judged on the half that did not choose them
    with SQLiteStore(tmp_path / "work" / "state" / "experience.db") as store:
        reported = [r for batch in store.reported_since("demo") for r in batch.records]
    assert reported and {r.request["temperature"] for r in reported} == {0.5}
    # invariant 2 holds for the canary's records too: every token stamped by the load that served it
    from reef.core.provenance import verified

    assert all(verified(r) for r in reported)
    served_by = {r.release.release_id for r in reported if r.release is not None}
    assert all(rid.startswith("canary-") or len(rid) == 40 for rid in served_by)
    # traffic asks training questions only; the test questions were asked but never reported
    train = {demo_tasks.user_prompt(t) for t in demo_tasks.train_tasks()}
    assert {r.request["messages"][-1]["content"] for r in reported} <= train
    n_test = len(demo_tasks.test_tasks())
    assert curve["test"]["start"]["n"] == curve["test"]["final"]["n"] == n_test
    assert result.start_test_success == curve["test"]["start"]["success"] and 0 <= result.start_test_success <= 1
    assert result.final_test_success is not None and result.final_test_release
    assert curve["test"]["final"]["minute"] >= curve["summary"]["minutes"]


@pytest.mark.slow
def test_sigterm_stops_a_background_demo_and_still_writes_the_curve(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A shell starts `reef demo --json &` with SIGINT ignored; SIGTERM must stop it all the same,
    and its stdout is the result alone (the progress goes to stderr); `--loss` reaches the learner."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "reef",
        "demo",
        "--json",
        "--minutes",
        "5",
        "--concurrency",
        "2",
        "--loss",
        "ppo",
        "--model-dir",
        str(tiny_model_dir),
        "--workdir",
        str(tmp_path / "work"),
        "--out-dir",
        str(out),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    demo = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 90
        while not _demo_has_traffic(tmp_path / "work" / "serve.yaml"):
            assert time.monotonic() < deadline and demo.poll() is None, "the demo sent no traffic"
            time.sleep(0.2)
        demo.send_signal(signal.SIGTERM)
        stdout, _ = demo.communicate(timeout=60)
        assert demo.returncode == 0
    finally:
        if demo.poll() is None:
            demo.kill()
    curve = json.loads((out / "learning_curve.json").read_text())
    assert curve["summary"]["interrupted"] is True
    assert json.loads(stdout)["interrupted"] is True
    assert yaml.safe_load((tmp_path / "work" / "serve.yaml").read_text())["learner"]["sao"]["loss"] == "ppo"
    assert curve["settings"]["loss"] == "ppo"  # --loss reaches the learner and the curve


def _demo_has_traffic(config: Path) -> bool:
    import httpx

    if not config.exists():
        return False
    port = yaml.safe_load(config.read_text())["port"]
    try:
        status = httpx.get(f"http://127.0.0.1:{port}/reef/status", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return False
    return any(s.get("cursor", 0) > 0 for s in status["learning"]["learners"])


def test_the_vllm_demo_serves_with_vllm_and_trains_the_same_model_folder(tmp_path: Path) -> None:
    """`reef demo --runtime vllm`: the same settings, served by a vLLM Reef starts on the folder
    the trainer trains (a full run is in docs/learning.md; tests/test_vllm_runtime.py runs the loop)."""
    from reef.config import load_config
    from reef.demo.server import demo_settings

    heldout = demo_tasks.write_heldout_jsonl(tmp_path / "heldout.jsonl")
    settings = demo_settings(tmp_path, heldout, 8765, tmp_path / "model", runtime="vllm")
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(settings))
    config = load_config(tmp_path / "serve.yaml", env={})
    assert config.runtime_kind == "vllm" and config.vllm.default_max_tokens == config.embedded.default_max_tokens
    assert config.embedded.model_dir == (tmp_path / "model").resolve()  # vLLM's default model folder
    assert config.learner.enabled and config.vllm.dtype == "auto"  # fp32 while learning
    gate = config.learner.gate  # the gate leaves the runtime to the traffic while the learner waits for samples
    assert (gate.concurrency, gate.concurrency_when) == (4, "starved")
    assert (
        demo_settings(tmp_path, heldout, 8765, None, canary=None)["learner"]["gate"].get("live_split") is None
    )  # needs a canary
