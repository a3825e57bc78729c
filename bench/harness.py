"""Does the harness learn? The `skills` recipe with the model-free proposer on SmolLM2, measured.

A real `reef serve` on the embedded model (SmolLM2-135M-Instruct, CPU) with one scenario bound
to `skills` (proposer `distill`) and an empty starting harness. Traffic: the demo's factual
questions (reef/demo/tasks.py, training split), asked bare, with no format instruction. The
format asked of the agent: ONE short sentence (at most 12 words, one sentence, ending in '.' or
'!') that contains an accepted answer. Strict scorer (`one_sentence_score`): 1 or 0. Each
failure is reported with textual feedback as a user would give it: "too long" feedback in three
phrasings when the form is wrong, "Wrong: the answer is X." when the content is. The gate
judges each candidate on held-out questions (never asked by traffic) with the same scorer,
greedy, margin 1.

Prints a table per release (held-out success as the gate measured it, live success of the
traffic it served) and writes bench/results/harness.json. Run on its own, not in CI:

    .venv/bin/python bench/harness.py [--minutes 8] [--concurrency 4] [--gate-tasks 24]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MAX_WORDS = 12
MAX_TOKENS = 32
TEMPERATURE = 0.7
TOO_LONG = (
    "Too long: answer in one short sentence.",
    "Answer in one short sentence, please; this rambles.",
    "Please keep it to one short sentence.",
)


def one_sentence_score(task: dict[str, Any], text: str) -> float:
    """1.0 for one finished sentence of at most 12 words holding an accepted answer, else 0."""
    reply = " ".join(text.split())
    if not reply or len(reply.split()) > MAX_WORDS or reply[-1] not in ".!":
        return 0.0
    if re.search(r"[.!?]\s", reply):  # a second sentence
        return 0.0
    lowered = reply.lower()
    return (
        1.0 if any(re.search(rf"(?<![\w-]){re.escape(a.lower())}(?![\w-])", lowered) for a in task["answers"]) else 0.0
    )


def feedback(task: dict[str, Any], text: str) -> str:
    reply = " ".join(text.split())
    if reply and len(reply.split()) <= MAX_WORDS and reply[-1] in ".!" and not re.search(r"[.!?]\s", reply):
        return f"Wrong: the answer is {task['answers'][0]}."
    pick = int(hashlib.sha256(task["question"].encode()).hexdigest(), 16) % len(TOO_LONG)
    return TOO_LONG[pick]


def write_gate_tasks(path: Path, n: int) -> list[dict[str, Any]]:
    from reef.demo.tasks import heldout_tasks

    tasks = sorted(heldout_tasks(), key=lambda t: hashlib.sha256(t["question"].encode()).hexdigest())[:n]
    path.write_text("".join(json.dumps({"prompt": t["question"], "answers": t["answers"]}) + "\n" for t in tasks))
    return tasks


class Traffic:
    """Asks training questions, scores each answer, reports it; remembers success per release."""

    def __init__(self, reef: Any) -> None:
        import openai

        from reef.client import ReefClient
        from reef.demo.tasks import train_tasks

        self.oai = openai.OpenAI(base_url=reef.base_url, api_key="x", max_retries=2, timeout=300)
        self.client = ReefClient(reef.url, timeout=60)
        self.tasks = train_tasks()
        self.results: dict[str, list[float]] = defaultdict(list)
        self.order: list[str] = []
        self.count = 0

    def one(self, i: int) -> None:
        task = self.tasks[(i * 7919) % len(self.tasks)]
        raw = self.oai.chat.completions.with_raw_response.create(
            model="smollm2",
            messages=[{"role": "user", "content": task["question"]}],
            max_tokens=MAX_TOKENS,
            temperature=TEMPERATURE,
            extra_headers={"x-reef-scenario": "fmt"},
        )
        text = raw.parse().choices[0].message.content or ""
        release = raw.headers["x-reef-release-id"]
        score = one_sentence_score(task, text)
        self.client.report(
            raw.headers["x-reef-agent-record-id"], score=score, feedback=None if score else feedback(task, text)
        )
        if release not in self.results:
            self.order.append(release)
        self.results[release].append(score)
        self.count += 1


def run(minutes: float, concurrency: int, gate_tasks: int, after: int) -> dict[str, Any]:
    from reef.client import ReefClient
    from reef.runtimes.model_files import ensure_embedded_model
    from tests.helpers.reef_server import ReefServer

    model_dir = ensure_embedded_model()
    with tempfile.TemporaryDirectory(prefix="reef-bench-harness-") as work:
        tasks_path = Path(work) / "gate.jsonl"
        write_gate_tasks(tasks_path, gate_tasks)
        settings = {
            "embedded": {"model_dir": str(model_dir), "max_batch": 8},
            "recipes": {"scenarios": {"fmt": "skills"}},
            "learner": {
                "poll_interval": 0.5,
                "skills": {
                    "proposer": "distill",
                    "min_recurrence": 3,
                    "batch_size": 8,
                    "successes": 0,
                    "gate": {
                        "tasks": str(tasks_path),
                        "scorer": "bench.harness:one_sentence_score",
                        "margin": 1,
                        "max_tokens": MAX_TOKENS,
                    },
                },
            },
        }
        started = time.monotonic()
        deadline = started + minutes * 60
        with ReefServer(Path(work), settings, startup_timeout=300) as reef:
            traffic = Traffic(reef)
            published_at: dict[str, float] = {}
            with ThreadPoolExecutor(concurrency) as pool:
                i = 0
                while time.monotonic() < deadline:
                    list(pool.map(traffic.one, range(i, i + concurrency)))
                    i += concurrency
                    with ReefClient(reef.url) as client:
                        releases = client.releases("fmt")["releases"]
                    for r in releases:
                        if r["operation"] == "training" and r["release_id"] not in published_at:
                            published_at[r["release_id"]] = time.monotonic() - started
                            print(
                                f"  minute {published_at[r['release_id']] / 60:.1f}: published {r['release_id'][:12]}",
                                flush=True,
                            )
                    head = releases[0]["release_id"]
                    if published_at and len(traffic.results.get(head, [])) >= after:
                        break  # enough traffic on the newest release
            with ReefClient(reef.url) as client:
                history = client._call("GET", "/reef/scenarios/fmt/decisions")["decisions"]  # noqa: SLF001
                status = next(s for s in client.status()["learning"]["learners"] if s["scenario"] == "fmt")
                releases = list(reversed(client.releases("fmt")["releases"]))
                harness = client.harness("fmt")
        return summarise(releases, history, traffic, status, harness, time.monotonic() - started, published_at)


def summarise(
    releases: list[dict[str, Any]],
    decisions: list[dict[str, Any]],
    traffic: Traffic,
    status: dict[str, Any],
    harness: dict[str, Any],
    seconds: float,
    published_at: dict[str, float],
) -> dict[str, Any]:
    rows = []
    first_gate = next((d["verdict"]["metrics"] for d in decisions if d["verdict"]), None)
    for r in releases:
        live = traffic.results.get(r["release_id"], [])
        metrics = (r.get("verdict") or {}).get("metrics") or {}
        gate = (
            metrics.get("candidate_success")
            if r["operation"] == "training"
            else (first_gate.get("current_success") if first_gate and r["operation"] == "creation" else None)
        )
        rows.append(
            {
                "release_id": r["release_id"],
                "step": r["step"],
                "operation": r["operation"],
                "minute": round(published_at.get(r["release_id"], 0.0) / 60, 1),
                "heldout_success": gate,
                "live_requests": len(live),
                "live_success": sum(live) / len(live) if live else None,
                "mutations": (r.get("metrics") or {}).get("proposal", {}).get("mutations"),
            }
        )
    return {
        "bench": "harness",
        "model": "SmolLM2-135M-Instruct",
        "proposer": "distill",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "seconds": round(seconds, 1),
        "requests": traffic.count,
        "releases": rows,
        "decisions": [
            {
                "step": d["step"],
                "decision": d["verdict"]["decision"] if d["verdict"] else None,
                **{k: v for k, v in ((d["verdict"] or {}).get("metrics") or {}).items() if k != "per_task"},
            }
            for d in decisions
        ],
        "learner": status,
        "final_rules": {p: t for p, t in harness.get("files", {}).items()},
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\n{result['requests']} requests in {result['seconds'] / 60:.1f} min; "
        f"{result['learner']['published']} published, {result['learner']['rejected']} rejected, "
        f"{result['learner']['abandoned']} skipped"
    )
    print(
        f"{'step':>4}  {'operation':<9}  {'minute':>6}  {'held-out success (gate)':>23}  {'live success':>12}  {'n':>4}"
    )
    for row in result["releases"]:
        gate = "-" if row["heldout_success"] is None else f"{row['heldout_success']:.1%}"
        live = "-" if row["live_success"] is None else f"{row['live_success']:.1%}"
        print(
            f"{row['step']:>4}  {row['operation']:<9}  {row['minute']:>6}  {gate:>23}  {live:>12}  {row['live_requests']:>4}"
        )
    for path, text in result["final_rules"].items():
        print(f"  {path}: {text.strip()!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--gate-tasks", type=int, default=24)
    parser.add_argument("--after", type=int, default=40, help="live requests on the newest release before stopping")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "harness.json")
    args = parser.parse_args()
    result = run(args.minutes, args.concurrency, args.gate_tasks, args.after)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
