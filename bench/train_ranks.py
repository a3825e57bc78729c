"""Training tokens a second of full-weight (or LoRA) steps on 1 and N ranks, through the training
worker as `reef serve` runs it (`learner.weights`, `learner.ranks`).

    python bench/train_ranks.py --model-dir ~/.cache/reef/smollm2-135m-instruct-fp32 --ranks 1 2

Each configuration: start the worker (torchrun for N > 1), one warm-up step, then `--steps`
steps of forward_backward + optim_step on a fixed batch of `--rows` rows of `--tokens` completion
tokens (cross-entropy), timed; tokens/s counts completion tokens trained. Prints one JSON line a
configuration. `measure()` is what bench/weight_push.py and tests call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from reef.core.training import AdamParams, Datum, LoraShape, LossConfig
from reef.grow.rank_launch import RankLayout
from reef.grow.worker import TrainingWorker


def batch(rows: int, tokens: int, prompt: int = 32) -> list[Datum]:
    return [
        Datum(
            [100 + (i * 7 + j) % 500 for j in range(prompt)],
            [200 + (i * 13 + j) % 700 for j in range(tokens)],
            [],
            [1.0] * tokens,
            [1.0] * tokens,
        )
        for i in range(rows)
    ]


async def measure(
    model_dir: Path,
    ranks: int,
    weights: str = "full",
    steps: int = 3,
    rows: int = 8,
    tokens: int = 32,
    threads: int | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    threads = threads or os.cpu_count() or 1
    worker = TrainingWorker(model_dir, threads=threads, device=device, weights=weights, layout=RankLayout(ranks=ranks))
    started = time.monotonic()
    await worker.start()
    start_s = time.monotonic() - started
    data, loss = batch(rows, tokens), LossConfig(micro_batch=rows)
    try:
        await worker.call("bench", "load_state", None, LoraShape())
        seconds = []
        for _ in range(steps + 1):  # the first is a warm-up
            began = time.monotonic()
            await worker.call("bench", "forward_backward", data, "cross_entropy", loss)
            await worker.call("bench", "optim_step", AdamParams(full_lr=1e-5))
            seconds.append(time.monotonic() - began)
        began = time.monotonic()
        files = await worker.call("bench", "save_state")
        save_s = time.monotonic() - began
    finally:
        await worker.close()
    step_s = sum(seconds[1:]) / steps
    return {
        "model_dir": str(model_dir),
        "weights": weights,
        "ranks": ranks,
        "device": device,
        "threads": threads,
        "start_s": round(start_s, 2),
        "step_s": round(step_s, 3),
        "tokens_per_s": round(rows * tokens / step_s, 1),
        "save_s": round(save_s, 2),
        "checkpoint_mb": round(sum(map(len, files.values())) / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--weights", choices=["full", "lora"], default="full")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads in all (split between ranks)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    for ranks in args.ranks:
        result = asyncio.run(
            measure(args.model_dir, ranks, args.weights, args.steps, args.rows, args.tokens, args.threads, args.device)
        )
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
