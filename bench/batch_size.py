"""How many requests the embedded runtime should generate together (`embedded.max_batch`).

The embedded runtime runs one batch at a time on its thread(s); a gate judging a candidate sends
all of a look's tasks at once (the race's sentence gate: 30-31 a look), live traffic sends what is
in flight. On SmolLM2-135M-Instruct, torch with one thread (what `reef serve` gives the runtime
on a 2-core machine), the race's `sentence` prompts (bench/race_tasks.py, one worked example):
- gate: its 92 held-out tasks, greedy, at most EVAL_MAX_TOKENS tokens, all queued at once;
- traffic: 64 training questions, temperature 1, at most TRAFFIC_MAX_TOKENS tokens, all queued
  at once (seeded, so every setting samples the same tokens as long as batching does not change
  the arithmetic: the bench checks the greedy answers are the same tokens in every setting);
for each `--batches` value, alternately, `--rounds` times. Prints seconds (best of the rounds),
answers a second and the ratio against the first value (the baseline, measured in the same run).

Writes bench/results/batch_size.json. (Commit 8cd08d0 also measured rows of several loads in one
batch, each with its own adapter, against this scheduler in the race's shape: no faster there,
so not kept.)

    HF_HUB_OFFLINE=1 .venv/bin/python bench/batch_size.py [--batches 8,16,32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import race_tasks  # noqa: E402
import torch  # noqa: E402
from shared_prefix import serve_once  # noqa: E402  (every request queued at once, so batches are full)

from reef.core.chat import ChatRequest, Message  # noqa: E402
from reef.runtimes.embedded import EmbeddedRuntime  # noqa: E402
from reef.runtimes.model_files import ensure_embedded_model  # noqa: E402

OUT = ROOT / "bench" / "results" / "batch_size.json"


def requests(tasks: list[dict[str, Any]], temperature: float, max_tokens: int) -> list[ChatRequest]:
    return [
        ChatRequest(
            model="m",
            dialect="openai",
            temperature=temperature,
            max_tokens=max_tokens,
            seed=i,
            messages=tuple(Message(m["role"], m["content"]) for m in race_tasks.messages(t)),
        )
        for i, t in enumerate(tasks)
    ]


async def measure(model_dir: Path, sizes: list[int], rounds: int) -> dict[str, Any]:
    runtime = EmbeddedRuntime(model_dir, threads=1, max_batch=max(sizes))
    await runtime.start()
    workloads = {
        "gate": requests(race_tasks.heldout_tasks(), 0.0, race_tasks.EVAL_MAX_TOKENS),
        "traffic": requests(race_tasks.train_tasks()[:64], 1.0, race_tasks.TRAFFIC_MAX_TOKENS),
    }
    results: dict[str, Any] = {}
    try:
        load = await runtime.load("base", {})
        await serve_once(runtime, load, workloads["gate"][:8])  # warm-up
        for name, batch in workloads.items():
            seconds: dict[int, list[float]] = {size: [] for size in sizes}
            tokens: dict[int, int] = {}
            outputs: dict[int, list[list[int]]] = {}
            for _ in range(rounds):
                for size in sizes:
                    runtime.max_batch = size
                    took, outputs[size] = await serve_once(runtime, load, batch)
                    tokens[size] = sum(map(len, outputs[size]))
                    seconds[size].append(took)
            results[name] = {
                "requests": len(batch),
                "seconds": {str(s): v for s, v in seconds.items()},
                "tokens": {str(s): t for s, t in tokens.items()},
                "same_tokens": all(outputs[s] == outputs[sizes[0]] for s in sizes),
            }
    finally:
        await runtime.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,16,32", help="max_batch values; the first is the baseline")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sizes = [int(s) for s in args.batches.split(",")]
    torch.set_num_threads(1)
    results = asyncio.run(measure(ensure_embedded_model(), sizes, args.rounds))
    for name, r in results.items():
        base = min(r["seconds"][str(sizes[0])])
        cells = []
        for size in sizes:
            best = min(r["seconds"][str(size)])
            cells.append(f"max_batch {size}: {best:.1f} s ({r['requests'] / best:.2f} answers/s, {base / best:.2f}x)")
        print(
            f"{name} ({r['requests']} requests, same tokens in every setting: {r['same_tokens']}): " + "; ".join(cells)
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "benchmark": "batch_size",
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "batches": sizes,
                "rounds": args.rounds,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
