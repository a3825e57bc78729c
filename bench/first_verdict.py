"""The first verdict at an agent's pace: how long a user waits for the gate once the first candidate is made.

One `reef serve` at a time (the embedded model, the demo's or the sentence task's held-out tasks
as the gate's, the gate as Reef's defaults have it: every candidate judged, a look's tasks at
once, no canary) and `--agents` clients that each ask a training question, report the verifier's
score on the receipt, and wait `--pause` seconds before the next, as an agent's turns come. Each
run stops at the first verdict. From the server's log and chain: when the learner started, when
the first batch was logged, how long the first verdict took (`seconds` of the `gate verdict`
line) and per look of the gate it took (`look_s`: a verdict may stop at any look, so its seconds
alone compare candidates, not the gate), and when it came, counted from the first request.

With `--baseline REV` the same runs are made, interleaved, with the server running the `reef` of
that git revision (a temporary worktree), and the ratios this checkout / baseline are printed:
the A/B of a change to the learner or the gate measured on one machine in one run. Results go to
a JSON file. Run on its own (not in CI), on an otherwise idle machine:

    .venv/bin/python bench/first_verdict.py [--task demo] [--agents 1] [--pause 4] [--runs 2] \\
        [--baseline REV] [--out bench/results/first_verdict.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx  # noqa: E402
import yaml  # noqa: E402
from learning_race import RaceTask, race_task  # noqa: E402

from reef.demo.run import DemoStats, _worker  # noqa: E402
from reef.demo.server import DemoServer, demo_settings, free_port  # noqa: E402


def run_once(
    task: RaceTask, workdir: Path, agents: int, pause: float, limit_s: float, seed: int, checkout: Path | None
) -> dict[str, Any]:
    """One server, traffic until its first verdict (or `limit_s`); the timings of that verdict."""
    heldout = task.module.write_heldout_jsonl(workdir / "heldout.jsonl")
    port = free_port()
    settings = demo_settings(
        workdir,
        heldout,
        port,
        None,
        scorer=task.scorer,
        traffic_max_tokens=task.traffic_max_tokens,
        gate_max_tokens=task.eval_max_tokens,
        gate_concurrency=None,
        gate_after_batches=1,
        live_split=None,
    )
    settings.update(log_level="info", log_format="json")
    config = workdir / "serve.yaml"
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    server = DemoServer(config, port, workdir / "serve.log", pythonpath=(str(BENCH),), checkout=checkout)
    server.start()
    try:
        started_wall, stats = asyncio.run(_drive(server, task, agents, pause, limit_s, seed))
    finally:
        server.stop()
    lines = _log_lines(server.log_path)
    learner = next((line for line in lines if line.get("message") == "learner started"), None)
    verdict = next((line for line in lines if line.get("message") == "gate verdict"), None)
    out: dict[str, Any] = {
        "requests": stats.requests,
        "errors": stats.errors,
        "learner_started_s": _since(learner, started_wall),
        "first_batch_s": _first_batch(workdir / "state", started_wall),
    }
    if verdict is not None:
        look = verdict.get("gate_look") or 1
        out.update(
            verdict_s=verdict["seconds"],
            look=look,
            look_s=round(verdict["seconds"] / look, 2),
            first_verdict_s=_since(verdict, started_wall),
            decision=verdict["decision"],
            wins=verdict.get("gate_wins"),
            losses=verdict.get("gate_losses"),
            ties=verdict.get("gate_ties"),
        )
    return out


async def _drive(
    server: DemoServer, task: RaceTask, agents: int, pause: float, limit_s: float, seed: int
) -> tuple[float, DemoStats]:
    stats = DemoStats(
        minutes=limit_s / 60, examples=task.examples, tasks=task.module, max_tokens=task.traffic_max_tokens
    )
    rng, stop = random.Random(seed), asyncio.Event()

    async with httpx.AsyncClient(base_url=server.url, timeout=300.0) as client:
        started_wall, deadline = time.time(), time.monotonic() + limit_s
        workers = [asyncio.create_task(_worker(client, stats, rng, stop, server, pause)) for _ in range(agents)]
        try:
            while time.monotonic() < deadline and not _has_verdict(server.log_path):
                await asyncio.sleep(1.0)
        finally:
            stop.set()
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
    return started_wall, stats


def _log_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for text in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            line = json.loads(text)
            if isinstance(line, dict):
                lines.append(line)
    return lines


def _has_verdict(path: Path) -> bool:
    return path.exists() and '"gate verdict"' in path.read_text(errors="replace")


def _since(line: dict[str, Any] | None, started_wall: float) -> float | None:
    """Seconds from the first request to a log line (its `ts` is UTC)."""
    if line is None:
        return None
    at = datetime.strptime(line["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    return round(at.timestamp() - started_wall, 2)


def _first_batch(state_dir: Path, started_wall: float) -> float | None:
    from reef.commit.state import ReefState
    from reef.core.types import Operation

    with ReefState.open(state_dir) as state:
        times = [
            e.recorded_at for s in state.scenarios() for e in state.chain(s).history() if e.operation is Operation.BATCH
        ]
    return round(min(times) - started_wall, 2) if times else None


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A detached git worktree of `revision`, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="reef-bench-baseline-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(path), revision],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(values), 2) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("demo", "sentence"), default="demo")
    parser.add_argument("--agents", type=int, default=1, help="clients, each with one request at a time")
    parser.add_argument("--pause", type=float, default=4.0, help="seconds an agent waits between its requests")
    parser.add_argument("--runs", type=int, default=2, help="runs of each arm, interleaved")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds a run waits for its first verdict")
    parser.add_argument("--baseline", default=None, help="a git revision to compare with (its reef serves)")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "first_verdict.json")
    args = parser.parse_args()
    task = race_task(args.task)
    arms: dict[str, list[dict[str, Any]]] = {"this": []}
    with contextlib.ExitStack() as stack:
        checkouts: dict[str, Path | None] = {"this": None}
        if args.baseline:
            checkouts = {"baseline": stack.enter_context(worktree(args.baseline)), "this": None}
            arms = {"baseline": [], "this": []}
        for run in range(args.runs):
            for arm, checkout in checkouts.items():
                with tempfile.TemporaryDirectory(prefix="reef-bench-first-verdict-") as work:
                    result = run_once(
                        task, Path(work), args.agents, args.pause, args.limit, seed=run, checkout=checkout
                    )
                arms[arm].append(result)
                print(f"{arm} run {run}: {json.dumps(result)}", flush=True)
    keys = ("first_batch_s", "look_s", "verdict_s", "first_verdict_s")
    summary = {arm: {key: median(runs, key) for key in keys} for arm, runs in arms.items()}
    if "baseline" in arms:
        summary["ratio"] = {
            key: (
                round(summary["this"][key] / summary["baseline"][key], 2)
                if summary["this"][key] and summary["baseline"][key]
                else None
            )
            for key in keys
        }
    print(json.dumps(summary, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "first_verdict",
                "machine": platform.platform(),
                "cpus": os.cpu_count(),
                "settings": {k: str(v) for k, v in vars(args).items()},
                "summary": summary,
                "runs": arms,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
