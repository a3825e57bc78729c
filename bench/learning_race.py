"""The race: does Reef learn as fast as a bare training loop? One run, one machine, one model.

Two arms, one after the other, each for `--minutes` of wall clock after its start-up:
- bare (bench/bare_loop.py): an in-process on-policy loop on SmolLM2-135M-Instruct; every
  `--snapshot-every` seconds the adapter weights in effect are kept;
- reef: `reef serve` (reef.demo.server) with the demo's learner, driven by `--concurrency`
  clients (reef.demo.run's traffic) that report the verifier's score on every receipt; every
  `--snapshot-every` seconds the serving release is recorded (GET .../releases, the head).
Both use the same model (the cache Reef uses), LoRA shape (the `sao` recipe's), learning rate
and batch (the demo's: reef.demo.server.LEARNING_RATE, 8), temperature and max tokens (the
task's traffic settings). After both, off the clock, every snapshot (bare: its weights; reef:
each serving release's adapter, read from its state directory) answers the task's TEST
questions greedily, through one evaluation function; nothing trains or selects on them. The
base is snapshot 0 (the base model), measured in the same run. With `--line`, Reef's learner
also writes every candidate it makes (bench/race_line.py, a recipe file) and the newest one at
each snapshot is measured the same way, as the arm `line`: what the learner trains, beside what
the gate let serve. With `--gate-from-train N`, Reef's gate also takes one in N of the training
questions, which its traffic then never asks; with `--gate-half` it judges on half its questions
and nothing asks the other half, so the gate's view of that half is free of its own selection
(bench/race_gate_split.py).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/learning_race.py [--task demo|sentence] [--minutes 15]
        [--arms bare,reef] [--snapshot-every 60] [--concurrency 8] [--loss cispo] [--seed 0] [--line] [--gate-from-train N | --gate-half]
        [--batching static|continuous] [--turn-steps N] [--serve-threads N] [--train-threads N]
        [--gate-answer-on runtime|trainer] [--steps-per-candidate K] [--eps-clip-high E] [--line [--fresh N]]
        [--out PATH.json]

Prints a table of test success at each snapshot minute for each arm, the minutes each took to
reach +10, +20 and +30 points over the base and the ratio reef/bare, the final values and the
mean of the last third of the run;
writes bench/results/learning_race_<task>.json and a PNG of both curves beside it. Tasks:
`demo` (reef.demo.tasks: one-word answers, base 16.5%) and `sentence` (bench/race_tasks.py: the
answer first in one fixed sentence, base 3.3%). Not in CI; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path[:0] = [str(ROOT), str(BENCH)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import bare_loop  # noqa: E402
import httpx  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from race_gate_split import HalfGate, WiderGate  # noqa: E402
from race_sabotage import FlippedScores  # noqa: E402

from reef.config import EmbeddedConfig  # noqa: E402
from reef.demo.run import SCENARIO, DemoStats, _worker, poll_learning  # noqa: E402
from reef.demo.server import (
    CANARY,
    GATE_AFTER_BATCHES,
    GATE_CONCURRENCY,
    GATE_CONCURRENCY_WHEN,  # noqa: E402
    GATE_HALVES,
    GATE_MAX_TOKENS,
    LEARNING_RATE,
    LIVE_SPLIT,
    LOSS,
    STEPS_PER_CANDIDATE,
    TRAFFIC_MAX_TOKENS,
    TRAFFIC_TEMPERATURE,
    DemoServer,
    canary_bound,
    demo_settings,
    free_port,
)

BATCH = 8  # the demo's learner.sao.batch_size
GAINS = (10, 20, 30)  # points over the base
EVAL_BATCH = 16
LINE_RECIPE = "race_line:LineSAO"  # bench/race_line.py
REEF_BATCHING = "continuous" if EmbeddedConfig().continuous_batching else "static"


@dataclass(frozen=True)
class ReefArm:
    """The settings of Reef's arm that a run may change (the rest are the demo's)."""

    concurrency: int = 8  # live clients, each with one request in flight
    canary: float | None = CANARY
    loss: str = LOSS
    seed: int = 0  # the clients' questions
    gate_concurrency: int | None = GATE_CONCURRENCY  # None: a look's tasks at once
    gate_concurrency_when: str = GATE_CONCURRENCY_WHEN
    gate_after_batches: int = GATE_AFTER_BATCHES
    line: bool = False  # also measure the newest candidate at each snapshot (bench/race_line.py)
    gate_from_train: int = 0  # also give the gate one in N training questions (bench/race_gate_split.py)
    gate_half: bool = False  # the gate judges on half its questions (bench/race_gate_split.py)
    gate_halves: bool | str = GATE_HALVES  # learner.gate.halves: each head's successors judged on the other half
    batching: str | None = None  # embedded.continuous_batching: "static", "continuous"; None: Reef's default
    turn_steps: int | None = None  # embedded.turn_steps; None: Reef's default
    live_split: float | None = LIVE_SPLIT  # learner.gate.live_split: the line beside the head once the tasks stall
    flip_scores: bool = False  # the clients report 1 - score (bench/race_sabotage.py); the gate's scorer stays real
    serve_threads: int | None = None  # embedded.threads; None: Reef's default, half the cores
    train_threads: int | None = None  # learner.train_threads; None: Reef's default, the other half
    gate_answer_on: str = "runtime"  # learner.gate.answer_on: the serving runtime, or the training process
    steps_per_candidate: int = STEPS_PER_CANDIDATE  # learner.sao.steps_per_candidate
    fresh: int = 0  # with `line`: a batch waits for this many samples of the newest candidate (bench/race_line.py)
    eps_clip_high: float | None = None  # learner.sao.eps_clip_high (cispo: the ratio's cap); None: the recipe's


@dataclass(frozen=True)
class RaceTask:
    name: str
    module: Any  # train_tasks, heldout_tasks, test_tasks, messages, score, success, feedback, write_heldout_jsonl
    scorer: str  # the gate's scorer, importable by the server (bench/ is on its PYTHONPATH)
    traffic_max_tokens: int
    eval_max_tokens: int  # the gate's, and the evaluation's
    examples: int


def race_task(name: str) -> RaceTask:
    if name == "demo":
        from reef.demo import tasks as demo

        return RaceTask(
            "demo", demo, "reef.demo.tasks:gate_score", TRAFFIC_MAX_TOKENS, GATE_MAX_TOKENS, demo.SHOWN_EXAMPLES
        )
    import race_tasks as sentence

    return RaceTask(
        "sentence",
        sentence,
        "race_tasks:gate_score",
        sentence.TRAFFIC_MAX_TOKENS,
        sentence.EVAL_MAX_TOKENS,
        sentence.SHOWN_EXAMPLES,
    )


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the bare arm --------------------------------------------------------------------------------


def run_bare(task: RaceTask, model: Any, tokenizer: Any, seconds: float, every: float, seed: int = 0) -> dict[str, Any]:
    log(f"bare: training for {seconds / 60:.1f} min (seed {seed})")
    if seed:  # seed 0 keeps the sampling stream load_model leaves, so earlier records of seed 0 still compare
        torch.manual_seed(seed)
    snaps, steps = bare_loop.run(
        model,
        tokenizer,
        task.module,
        seconds,
        every,
        lr=LEARNING_RATE,
        batch=BATCH,
        temperature=TRAFFIC_TEMPERATURE,
        max_tokens=task.traffic_max_tokens,
        seed=seed,
        log=log,
    )
    log(f"bare: {len(steps)} steps, {len(steps) * BATCH} scored rollouts")
    return {"snapshots": [{"second": s, "weights": w} for s, w in snaps], "steps": steps}


# -- the reef arm --------------------------------------------------------------------------------


def run_reef(task: RaceTask, seconds: float, every: float, workdir: Path, arm: ReefArm) -> dict[str, Any]:
    if arm.gate_from_train or arm.gate_half:
        split = WiderGate(task.module, arm.gate_from_train) if arm.gate_from_train else HalfGate(task.module)
        task = replace(task, module=split)
        log(
            f"reef: the gate has {len(task.module.heldout_tasks())} tasks, traffic "
            f"{len(task.module.train_tasks())} questions"
        )
    heldout = task.module.write_heldout_jsonl(workdir / "heldout.jsonl")
    if arm.flip_scores:
        task = replace(task, module=FlippedScores(task.module))
        log("reef: the clients report every score flipped (1 - score); the gate's scorer is the real one")
    port = free_port()
    config = workdir / "serve.yaml"
    settings = demo_settings(
        workdir,
        heldout,
        port,
        None,
        LEARNING_RATE,
        scorer=task.scorer,
        traffic_max_tokens=task.traffic_max_tokens,
        gate_max_tokens=task.eval_max_tokens,
        canary=arm.canary,
        loss=arm.loss,
        gate_concurrency=arm.gate_concurrency,
        gate_concurrency_when=arm.gate_concurrency_when,
        gate_after_batches=arm.gate_after_batches,
        gate_halves=arm.gate_halves,
    )
    settings["learner"]["gate"]["live_split"] = arm.live_split or None
    settings["learner"].update(canary_bound(arm.canary, arm.live_split))  # an arm's fraction above the bound
    settings["learner"]["gate"]["answer_on"] = arm.gate_answer_on
    settings["learner"]["sao"]["steps_per_candidate"] = arm.steps_per_candidate
    if arm.eps_clip_high is not None:
        settings["learner"]["sao"]["eps_clip_high"] = arm.eps_clip_high
    if arm.batching is not None:
        settings["embedded"]["continuous_batching"] = arm.batching == "continuous"
    if arm.turn_steps is not None:
        settings["embedded"]["turn_steps"] = arm.turn_steps
    if arm.serve_threads is not None:
        settings["embedded"]["threads"] = arm.serve_threads
    if arm.train_threads is not None:
        settings["learner"]["train_threads"] = arm.train_threads
    line_dir = workdir / "line"
    if arm.line:
        shutil.rmtree(line_dir, ignore_errors=True)
        settings["recipes"] = {"default": LINE_RECIPE}
        settings["learner"][LINE_RECIPE] = {
            **settings["learner"].pop("sao"),
            "line_dir": str(line_dir.resolve()),
            "fresh": arm.fresh,
        }
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    server = DemoServer(config, port, workdir / "serve.log", pythonpath=(str(BENCH),))
    log(f"reef: starting reef serve on {server.url} (log {server.log_path})")
    server.start()
    try:
        log(f"reef: traffic for {seconds / 60:.1f} min, {arm.concurrency} in flight")
        serving, stats = asyncio.run(_drive(server, task, seconds, every, arm.concurrency, arm.seed))
    finally:
        server.stop()
    published, rejected = stats.counts()
    log(
        f"reef: {stats.requests} requests, {stats.reports} reports, {stats.errors} errors, "
        f"{published} published, {rejected} rejected"
    )
    weights = _release_weights(workdir / "state", {s["release_id"] for s in serving} - {None})
    return {
        "snapshots": [{**s, "weights": weights.get(s["release_id"])} for s in serving],
        "requests": stats.requests,
        "reports": stats.reports,
        "errors": stats.errors,
        "published": published,
        "rejected": rejected,
        "last_error": stats.last_error,
        "verdicts": _verdicts(workdir / "state", serving[0]["wall"] - serving[0]["second"]),
        "traffic": _traffic(workdir / "state", serving[0]["wall"] - serving[0]["second"]),
        **({"line": _line_snapshots(line_dir, serving)} if arm.line else {}),
    }


def _line_snapshots(line_dir: Path, serving: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At each snapshot, the newest candidate the learner had made by then (the base before the first)."""
    from safetensors.torch import load_file

    made = sorted((float(path.stem), path) for path in line_dir.glob("*.safetensors"))
    snapshots = []
    for snap in serving:
        newest = [path for second, path in made if second <= snap["wall"]]
        snapshots.append(
            {"second": snap["second"], "candidates": len(newest), "weights": load_file(newest[-1]) if newest else None}
        )
    return snapshots


async def _drive(
    server: DemoServer, task: RaceTask, seconds: float, every: float, concurrency: int, seed: int = 0
) -> tuple[list[dict[str, Any]], DemoStats]:
    stats = DemoStats(
        minutes=seconds / 60, examples=task.examples, tasks=task.module, max_tokens=task.traffic_max_tokens
    )
    stop, rng = asyncio.Event(), random.Random(seed)  # the questions; the server samples with its own seeds
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=server.url, timeout=300.0, limits=limits) as client:
        started, started_wall = time.monotonic(), time.time()
        workers = [asyncio.create_task(_worker(client, stats, rng, stop, server)) for _ in range(concurrency)]
        serving: list[dict[str, Any]] = []
        try:
            for due in bare_loop.snapshot_times(seconds, every):
                await asyncio.sleep(max(0.0, started + due - time.monotonic()))
                for worker in workers:
                    if worker.done() and worker.exception() is not None:
                        raise worker.exception()  # type: ignore[misc]
                serving.append({"second": due, "wall": started_wall + due, "release_id": await _head(client)})
        finally:
            stop.set()
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        await poll_learning(client, stats)
    return serving, stats


async def _head(client: httpx.AsyncClient, tries: int = 3) -> str | None:
    """The serving release; None before the scenario exists (the base model serves then)."""
    for attempt in range(tries):
        try:
            response = await client.get(f"/reef/scenarios/{SCENARIO}/releases", timeout=30.0)
            if response.status_code == 404:
                return None
            response.raise_for_status()
            return str(response.json()["head"])
        except httpx.HTTPError:
            if attempt == tries - 1:
                raise
            await asyncio.sleep(1.0)
    return None


def _release_weights(state_dir: Path, release_ids: set[str]) -> dict[str, dict[str, torch.Tensor] | None]:
    """Each release's LoRA weights (None: no adapter, the base model), from the state directory."""
    from safetensors.torch import load

    from reef.commit.state import ReefState
    from reef.core.training import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_part

    out: dict[str, dict[str, torch.Tensor] | None] = {}
    with ReefState.open(state_dir) as state:
        for release_id in release_ids:
            files = adapter_part(state.artifacts.files(release_id))
            if files is not None:
                config = json.loads(files[ADAPTER_CONFIG])
                assert (config["r"], config["lora_alpha"]) == (bare_loop.LORA.r, bare_loop.LORA.alpha), config
            out[release_id] = None if files is None else load(files[ADAPTER_WEIGHTS])
    return out


def _verdicts(state_dir: Path, started_wall: float) -> list[dict[str, Any]]:
    """Each verdict of the run's chain: its minute (since the traffic began), its decision, the
    gate's tasks won, lost and tied."""
    from reef.commit.state import ReefState

    with ReefState.open(state_dir) as state:
        entries = [e for scenario in state.scenarios() for e in state.chain(scenario).history()]
    return [
        {
            "minute": round((e.recorded_at - started_wall) / 60, 2),
            "decision": e.verdict.decision,
            **{k: e.verdict.metrics.get(k) for k in ("wins", "losses", "ties") if k in e.verdict.metrics},
        }
        for e in sorted(entries, key=lambda e: e.recorded_at)
        if e.verdict is not None
    ]


def _traffic(state_dir: Path, started_wall: float) -> list[dict[str, Any]]:
    """The clients' reported scores, a minute of the run each (by when the report came): how many,
    their mean, and the share scored 1 (an exact answer). Whatever served them (the head, a canary),
    these are what the line trains on: a line held at the base's answers by their partial credit
    shows as a mean that climbs while the exact share stays at the base's."""
    from reef.commit.state import ReefState

    with ReefState.open(state_dir) as state:
        return traffic_by_minute(state.store, started_wall)


def traffic_by_minute(store: Any, started_wall: float) -> list[dict[str, Any]]:
    """`_traffic` from an experience store (`reef.observe.store.ExperienceStore`)."""
    scores: dict[int, list[float]] = {}
    for item in store.reported_since(SCENARIO, 0, -1):
        minute = int((item.report.created_at or started_wall) - started_wall) // 60
        scores.setdefault(minute, []).extend(item.report.score for _ in item.records)
    return [
        {
            "minute": minute,
            "samples": len(s),
            "mean_score": round(sum(s) / len(s), 4),
            "exact": round(sum(x == 1.0 for x in s) / len(s), 4),
        }
        for minute, s in sorted(scores.items())
        if s
    ]


# -- evaluation (off the clock, one function for both arms) ------------------------------------


def evaluate(model: Any, tokenizer: Any, weights: dict[str, torch.Tensor], task: RaceTask) -> float:
    """Greedy success (exact and finished) on the task's test questions with these LoRA weights."""
    return evaluate_by_kind(model, tokenizer, weights, task)["all"]


def evaluate_by_kind(
    model: Any,
    tokenizer: Any,
    weights: dict[str, torch.Tensor],
    task: RaceTask,
    questions: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """`evaluate`'s success, as `all` and per kind of question (the tasks' `category`), on the
    test questions or on `questions`."""
    from peft import set_peft_model_state_dict

    loaded = set_peft_model_state_dict(model, weights)
    assert not loaded.unexpected_keys, f"adapter weights that fit no LoRA module: {loaded.unexpected_keys[:3]}"
    tests = task.module.test_tasks() if questions is None else questions
    hits: dict[str, list[bool]] = {}
    for start in range(0, len(tests), EVAL_BATCH):
        chunk = tests[start : start + EVAL_BATCH]
        prompts = [bare_loop.prompt_ids(tokenizer, task.module.messages(t)) for t in chunk]
        comps, _, finish = bare_loop.generate(model, prompts, 0.0, task.eval_max_tokens)
        for t, c, f in zip(chunk, comps, finish):
            ok = task.module.success(t, bare_loop.decode(tokenizer, c), f)
            for kind in ("all", t.get("category", "all")):
                hits.setdefault(kind, []).append(bool(ok))
    by_kind = {kind: sum(v) / len(v) for kind, v in hits.items()}
    return {"all": by_kind.pop("all"), **dict(sorted(by_kind.items()))}


def kinds_text(by_kind: dict[str, float]) -> str:
    return ", ".join(f"{kind} {100 * v:.0f}%" for kind, v in by_kind.items() if kind != "all")


def _digest(weights: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def evaluate_arms(
    arms: dict[str, dict[str, Any]], model: Any, tokenizer: Any, base: dict[str, torch.Tensor], task: RaceTask
) -> float:
    """Adds `success` to every snapshot (equal weights are evaluated once); the base's success."""
    seen = {_digest(base): evaluate_by_kind(model, tokenizer, base, task)}
    log(f"eval: base {100 * seen[_digest(base)]['all']:.1f}% ({kinds_text(seen[_digest(base)])})")
    for name, arm in arms.items():
        for snap in arm["snapshots"]:
            weights = snap.pop("weights") or base
            key = _digest(weights)
            if key not in seen:
                seen[key] = evaluate_by_kind(model, tokenizer, weights, task)
                log(
                    f"eval: {name} at {snap['second'] / 60:.1f} min: {100 * seen[key]['all']:.1f}% "
                    f"({kinds_text(seen[key])})"
                )
            snap["minute"], snap["success"], snap["by_kind"] = (
                round(snap["second"] / 60, 3),
                seen[key]["all"],
                seen[key],
            )
    return seen[_digest(base)]["all"]


# -- the report ----------------------------------------------------------------------------------


def time_to(points: list[dict[str, Any]], base: float, gain: int) -> float | None:
    """The first snapshot minute at which success is `gain` points over the base."""
    return next((p["second"] / 60 for p in points if p["success"] >= base + gain / 100 - 1e-9), None)


def summarise(arms: dict[str, dict[str, Any]], base: float) -> dict[str, Any]:
    reach = {name: {str(g): time_to(arm["snapshots"], base, g) for g in GAINS} for name, arm in arms.items()}
    ratio = {}
    if {"bare", "reef"} <= set(arms):
        for g in map(str, GAINS):
            bare, reef = reach["bare"][g], reach["reef"][g]
            ratio[g] = reef / bare if bare and reef is not None else None
    final = {name: arm["snapshots"][-1]["success"] for name, arm in arms.items()}
    late = {name: late_mean(arm["snapshots"]) for name, arm in arms.items()}
    rollouts = {name: len(arm["steps"]) * BATCH if name == "bare" else arm["reports"] for name, arm in arms.items()}
    return {
        "base": base,
        "minutes_to_gain": reach,
        "ratio_reef_over_bare": ratio,
        "final": final,
        "late_mean": late,
        "scored_rollouts": rollouts,
    }


def late_mean(points: list[dict[str, Any]]) -> float:
    """Mean success over the last third of the run (minutes 10-15 of 15): one snapshot of a curve
    that moves several points minute to minute is a noisy end."""
    start = points[-1]["second"] * 2 / 3
    late = [p["success"] for p in points if p["second"] >= start - 1e-9]
    return sum(late) / len(late)


def table(arms: dict[str, dict[str, Any]], summary: dict[str, Any]) -> str:
    pct = lambda v: "-" if v is None else f"{100 * v:5.1f}%"  # noqa: E731
    mins = lambda v: "not reached" if v is None else f"{v:.1f} min"  # noqa: E731
    names = list(arms)
    lines = ["minute  " + "  ".join(f"{n:>8}" for n in names)]
    for i, snap in enumerate(next(iter(arms.values()))["snapshots"]):
        row = [pct(arms[n]["snapshots"][i]["success"]) if i < len(arms[n]["snapshots"]) else "-" for n in names]
        lines.append(f"{snap['second'] / 60:6.1f}  " + "  ".join(f"{r:>8}" for r in row))
    lines.append(f"base (snapshot 0): {pct(summary['base'])}")
    for g in map(str, GAINS):
        parts = [f"{n} {mins(summary['minutes_to_gain'][n][g])}" for n in names]
        ratio = summary["ratio_reef_over_bare"].get(g)
        if ratio is not None:
            parts.append(f"reef/bare {ratio:.2f}")
        lines.append(f"time to +{g} points: " + ", ".join(parts))
    lines.append("final: " + ", ".join(f"{n} {pct(v)}" for n, v in summary["final"].items()))
    lines.append("mean of the last third: " + ", ".join(f"{n} {pct(v)}" for n, v in summary["late_mean"].items()))
    lines += [f"final by kind, {n}: {kinds_text(arm['snapshots'][-1]['by_kind'])}" for n, arm in arms.items()]
    lines.append("scored rollouts: " + ", ".join(f"{n} {v}" for n, v in summary["scored_rollouts"].items()))
    return "\n".join(lines)


def plot_subject(arms: dict[str, dict[str, Any]]) -> str:
    """What the picture shows: the race only where the bare loop ran beside Reef."""
    if "bare" in arms and "reef" in arms:
        return "Reef vs a bare loop"
    return "Reef's arm alone" if "reef" in arms else "the bare loop alone"


ARM_COLOURS = {"bare": "C0", "reef": "C1", "line": "C2"}  # an arm keeps its colour when another did not run


def plot(arms: dict[str, dict[str, Any]], base: float, task: RaceTask, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, arm in arms.items():
        minutes = [s["second"] / 60 for s in arm["snapshots"]]
        ax.plot(
            minutes, [100 * s["success"] for s in arm["snapshots"]], marker="o", label=name, color=ARM_COLOURS.get(name)
        )
    for g in (0, *GAINS):
        ax.axhline(100 * base + g, color="grey", lw=0.6, ls="-" if g == 0 else ":")
        ax.annotate(
            f"+{g}" if g else "base",
            (1.0, 100 * base + g),
            xycoords=("axes fraction", "data"),
            xytext=(3, -3),
            textcoords="offset points",
            fontsize=8,
            color="grey",
        )
    ax.set(
        xlabel="minutes of wall clock",
        ylabel="test success, greedy (%)",
        ylim=(0, 100),
        title=f"task {task.name}: {plot_subject(arms)}, {len(task.module.test_tasks())} test questions",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["demo", "sentence"], default="demo")
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--arms", default="bare,reef", help="comma-separated, from bare and reef")
    parser.add_argument("--snapshot-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--canary",
        type=float,
        default=CANARY,
        help="reef: learner.canary of the scenario, the fraction of requests the newest candidate "
        "under test serves (0: none)  [default: the demo's]",
    )
    parser.add_argument(
        "--loss",
        choices=["ppo", "clipped_is", "cispo"],
        default=LOSS,
        help="reef: learner.sao.loss  [default: the demo's, %(default)s]",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="bare: the questions and the sampling; reef: the clients' questions. A run is one "
        "draw of a noisy process: compare runs of several seeds",
    )
    parser.add_argument(
        "--gate-concurrency",
        type=int,
        default=GATE_CONCURRENCY,
        help="reef: learner.gate.concurrency, the gate's requests in flight at once (0: a look's "
        "tasks all at once)  [default: the demo's, %(default)s]",
    )
    parser.add_argument(
        "--gate-concurrency-when",
        choices=["always", "starved"],
        default=GATE_CONCURRENCY_WHEN,
        help="reef: learner.gate.concurrency_when, whether the bound holds at every verdict or only "
        "while the learner waits for samples  [default: the demo's, %(default)s]",
    )
    parser.add_argument(
        "--gate-after",
        type=int,
        default=GATE_AFTER_BATCHES,
        help="reef: learner.gate.after_batches, the candidates a line takes past the release it "
        "would replace before the gate judges it  [default: the demo's, %(default)s]",
    )
    parser.add_argument(
        "--line",
        action="store_true",
        help="reef: also measure the line the learner trains, the newest candidate at each snapshot "
        "(bench/race_line.py writes each candidate's adapter; shown as the arm `line`)",
    )
    parser.add_argument(
        "--gate-from-train",
        type=int,
        default=0,
        metavar="N",
        help="reef: also give the gate one in N of the training questions (by a hash), which its "
        "traffic then never asks; the bare loop still trains on all (bench/race_gate_split.py; "
        "0: none)  [default: %(default)s]",
    )
    parser.add_argument(
        "--gate-half",
        action="store_true",
        help="reef: the gate judges on half its questions and nothing asks the other half, a view "
        "free of the gate's own selection",
    )
    parser.add_argument(
        "--gate-halves",
        nargs="?",
        const=True,
        default=GATE_HALVES,
        choices=["after_first", "off"],
        metavar="after_first|off",
        help="reef: learner.gate.halves, each candidate judged on the half of the gate's questions "
        "its serving release was not selected on; after_first: the base's candidates on every "
        f"question; off: every candidate on every question  [default: the demo's, {GATE_HALVES}]",
    )
    parser.add_argument(
        "--batching",
        choices=["static", "continuous"],
        default=None,
        help="reef: embedded.continuous_batching false (static: a batch runs from start to end, joined "
        f"by nothing) or true (continuous)  [default: Reef's, {REEF_BATCHING}]",
    )
    parser.add_argument(
        "--turn-steps",
        type=int,
        default=None,
        help="reef: embedded.turn_steps, decoding steps a load's batch runs while another load waits",
    )
    parser.add_argument(
        "--serve-threads",
        type=int,
        default=None,
        metavar="N",
        help="reef: embedded.threads, torch threads of the serving runtime (traffic and the gate)  "
        "[default: Reef's, half the cores]",
    )
    parser.add_argument(
        "--train-threads",
        type=int,
        default=None,
        metavar="N",
        help="reef: learner.train_threads, torch threads of the training process  "
        "[default: Reef's, the other half of the cores]",
    )
    parser.add_argument(
        "--gate-answer-on",
        choices=["runtime", "trainer"],
        default="runtime",
        help="reef: learner.gate.answer_on, where the gate's tasks are answered: the serving runtime "
        "(beside the traffic) or the training process (whenever it waits for samples, and a "
        "quarter of its time while it trains)  [default: %(default)s]",
    )
    parser.add_argument(
        "--steps-per-candidate",
        type=int,
        default=STEPS_PER_CANDIDATE,
        metavar="K",
        help="reef: learner.sao.steps_per_candidate, optimiser steps a candidate (fewer: samples "
        "fewer steps behind the weights they train)  [default: the demo's, %(default)s]",
    )
    parser.add_argument(
        "--fresh",
        type=int,
        default=0,
        metavar="N",
        help="reef, with --line: a batch waits until N of its samples were served by the newest "
        "candidate's canary, the one the next trains on from (bench/race_line.py)  [default: 0]",
    )
    parser.add_argument(
        "--eps-clip-high",
        type=float,
        default=None,
        metavar="E",
        help="reef: learner.sao.eps_clip_high, with cispo the cap on a token's importance ratio is "
        "1 + E  [default: the sao recipe's, 0.28]",
    )
    parser.add_argument(
        "--live-split",
        type=float,
        default=LIVE_SPLIT,
        metavar="F",
        help="reef: learner.gate.live_split, once three verdicts in a row run to their last look "
        "undecided the canary serves F of the requests and the line's live scores join later "
        f"verdicts (0: off)  [default: the demo's, {LIVE_SPLIT}]",
    )
    parser.add_argument(
        "--flip-scores",
        action="store_true",
        help="sabotage: Reef's clients report 1 - score (bench/race_sabotage.py); its head must stay at the base",
    )
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/learning_race_<task>.json")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the reef arm's serve.yaml, state and serve.log here  [default: a temporary folder]",
    )
    args = parser.parse_args()
    args.gate_halves = False if args.gate_halves == "off" else args.gate_halves
    task, seconds = race_task(args.task), args.minutes * 60
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not names or set(names) - {"bare", "reef"}:
        parser.error("--arms takes bare, reef or both")
    if args.fresh and not args.line:
        parser.error("--fresh waits in the line's recipe (bench/race_line.py): add --line")
    if args.gate_half and args.gate_from_train:
        parser.error("--gate-half and --gate-from-train are two different splits: choose one")
    out = args.out or BENCH / "results" / f"learning_race_{task.name}.json"
    tokenizer, model = bare_loop.load_model()
    base = bare_loop.adapter_weights(model)  # a fresh adapter (B = 0): the base model
    arms: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="reef-race-") as work:
        workdir = args.workdir or Path(work)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in names:
            if name == "bare":
                arms[name] = run_bare(task, model, tokenizer, seconds, args.snapshot_every, args.seed)
            else:
                arm = ReefArm(
                    args.concurrency,
                    args.canary,
                    args.loss,
                    args.seed,
                    args.gate_concurrency or None,
                    args.gate_concurrency_when,
                    args.gate_after,
                    args.line,
                    args.gate_from_train,
                    args.gate_half,
                    args.gate_halves,
                    args.batching,
                    args.turn_steps,
                    args.live_split,
                    args.flip_scores,
                    args.serve_threads,
                    args.train_threads,
                    args.gate_answer_on,
                    args.steps_per_candidate,
                    args.fresh,
                    args.eps_clip_high,
                )
                arms[name] = run_reef(task, seconds, args.snapshot_every, workdir, arm)
                if "line" in arms[name]:
                    arms["line"] = {"snapshots": arms[name].pop("line"), "reports": arms[name]["reports"]}
    base_success = evaluate_arms(arms, model, tokenizer, base, task)
    summary = summarise(arms, base_success)
    print(table(arms, summary))
    write(out, args, task, arms, summary)
    plot(arms, base_success, task, out.with_suffix(".png"))
    log(f"wrote {out} and {out.with_suffix('.png')}")


def write(out: Path, args: Any, task: RaceTask, arms: dict[str, dict[str, Any]], summary: dict[str, Any]) -> None:
    settings = {
        "task": task.name,
        "minutes": args.minutes,
        "snapshot_every_s": args.snapshot_every,
        "concurrency": args.concurrency,
        "canary": args.canary,
        "loss": args.loss,
        "seed": args.seed,
        "gate_concurrency": args.gate_concurrency,
        "gate_concurrency_when": args.gate_concurrency_when,
        "gate_after_batches": args.gate_after,
        "line": args.line,
        "gate_from_train": args.gate_from_train,
        "gate_half": args.gate_half,
        "gate_halves": args.gate_halves,
        "batching": args.batching or REEF_BATCHING,
        "turn_steps": args.turn_steps,
        "live_split": args.live_split,
        "serve_threads": args.serve_threads,
        "train_threads": args.train_threads,
        "gate_answer_on": args.gate_answer_on,
        "lr": LEARNING_RATE,
        "batch": BATCH,
        "steps_per_candidate": args.steps_per_candidate,
        "fresh": args.fresh,
        "eps_clip_high": args.eps_clip_high,
        "temperature": TRAFFIC_TEMPERATURE,
        "traffic_max_tokens": task.traffic_max_tokens,
        "eval_max_tokens": task.eval_max_tokens,
        "examples": task.examples,
        "lora": {
            "r": bare_loop.LORA.r,
            "alpha": bare_loop.LORA.alpha,
            "target_modules": list(bare_loop.LORA.target_modules),
        },
        "test_questions": len(task.module.test_tasks()),
        "torch_threads": torch.get_num_threads(),
    }
    record = {
        "benchmark": "learning_race",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": settings,
        "summary": summary,
        "arms": arms,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
