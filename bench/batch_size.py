"""How many requests the embedded runtime should generate together (`embedded.max_batch`), and
whether rows of different loads should share a batch (each row with its own adapter).

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

Then the race's shape (`--mixed`): 8 live clients asking training questions one after another
(temperature 1) on one LoRA load (a canary), while a gate judges another LoRA load on the 92
held-out tasks in 3 looks (each look's ~31 requests at once, greedy); the adapters are peft's
fresh ones (B = 0: the base model's answers, through the LoRA path). Measured: how long the
gate took and how many live answers came back meanwhile, for the embedded runtime as it was
(a batch holds one load's requests, loads take turns; max_batch 8) and with rows of several
loads in one batch (each `--batches` value). Writes bench/results/batch_size.json.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/batch_size.py [--batches 8,16,32] [--rounds 2] [--mixed-rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import race_tasks  # noqa: E402
from reef.core.chat import ChatRequest, ChatResult, Message  # noqa: E402
from reef.core.types import ReleaseRef  # noqa: E402
from reef.runtimes.embedded import EmbeddedRuntime  # noqa: E402
from reef.runtimes.model_files import ensure_embedded_model  # noqa: E402

OUT = ROOT / "bench" / "results" / "batch_size.json"


def requests(tasks: list[dict[str, Any]], temperature: float, max_tokens: int) -> list[ChatRequest]:
    return [ChatRequest(model="m", dialect="openai", temperature=temperature, max_tokens=max_tokens, seed=i,
                        messages=tuple(Message(m["role"], m["content"]) for m in race_tasks.messages(t)))
            for i, t in enumerate(tasks)]


async def serve_all(runtime: EmbeddedRuntime, load: str, batch: list[ChatRequest]) -> tuple[float, list[list[int]], int]:
    async def one(req: ChatRequest) -> list[int]:
        result = ChatResult()
        async for delta in runtime.generate(req, ReleaseRef("r", "c", load)):
            result.add(delta)
        return list(result.token_ids)

    started = time.perf_counter()
    with runtime.paused():  # queue them all, so batches are as full as max_batch allows
        pending = [asyncio.create_task(one(r)) for r in batch]
        await asyncio.sleep(0.05)
    outputs = await asyncio.gather(*pending)
    return time.perf_counter() - started, outputs, sum(map(len, outputs))


def fresh_adapter(model_dir: Path, folder: Path) -> dict[str, bytes]:
    """A peft LoRA adapter shaped as `sao`'s (B = 0), as release bytes."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from reef.recipes.sao import SAOConfig

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=SAOConfig().lora_r, lora_alpha=SAOConfig().lora_alpha,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    get_peft_model(base, config).save_pretrained(str(folder))
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


async def gate_with_live_traffic(runtime: EmbeddedRuntime, live_load: str, gate_load: str,
                                 clients: int = 8) -> dict[str, float]:
    """The gate's 92 tasks in 3 looks on `gate_load` while `clients` live clients keep asking on
    `live_load`: (gate seconds, live answers meanwhile, live answers a second)."""
    gate = requests(race_tasks.heldout_tasks(), 0.0, race_tasks.EVAL_MAX_TOKENS)
    live = requests(race_tasks.train_tasks(), 1.0, race_tasks.TRAFFIC_MAX_TOKENS)
    done = asyncio.Event()
    answered = 0

    async def one(req: ChatRequest, load: str) -> None:
        async for _ in runtime.generate(req, ReleaseRef("r", "c", load)):
            pass

    async def client(k: int) -> None:
        nonlocal answered
        i = k
        while not done.is_set():
            await one(live[i % len(live)], live_load)
            answered += 1 if not done.is_set() else 0
            i += clients

    started = time.perf_counter()
    tasks = [asyncio.create_task(client(k)) for k in range(clients)]
    await asyncio.sleep(0.5)  # the live clients are going
    counted_from, answered = time.perf_counter(), 0
    for look in (gate[:31], gate[31:62], gate[62:]):
        await asyncio.gather(*(one(r, gate_load) for r in look))
    seconds = time.perf_counter() - counted_from
    done.set()
    await asyncio.gather(*tasks)
    return {"gate_seconds": seconds, "live_answers": answered, "live_per_second": answered / seconds,
            "wall_seconds": time.perf_counter() - started}


async def mixed(model_dir: Path, settings: list[tuple[str, bool, int]], rounds: int) -> dict[str, Any]:
    runtime = EmbeddedRuntime(model_dir, threads=1)
    await runtime.start()
    results: dict[str, Any] = {name: [] for name, _, _ in settings}
    try:
        with tempfile.TemporaryDirectory() as folder:
            files = fresh_adapter(model_dir, Path(folder))
        live_load, gate_load = await runtime.load("canary", files), await runtime.load("candidate", files)
        for _ in range(rounds):
            for name, mix, size in settings:
                runtime.mix_loads, runtime.max_batch = mix, size
                results[name].append(await gate_with_live_traffic(runtime, live_load, gate_load))
    finally:
        await runtime.close()
    return results


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
        await serve_all(runtime, load, workloads["gate"][:8])  # warm-up
        for name, batch in workloads.items():
            seconds: dict[int, list[float]] = {size: [] for size in sizes}
            tokens: dict[int, int] = {}
            outputs: dict[int, list[list[int]]] = {}
            for _ in range(rounds):
                for size in sizes:
                    runtime.max_batch = size
                    took, outputs[size], tokens[size] = await serve_all(runtime, load, batch)
                    seconds[size].append(took)
            results[name] = {"requests": len(batch), "seconds": {str(s): v for s, v in seconds.items()},
                             "tokens": {str(s): t for s, t in tokens.items()},
                             "same_tokens": all(outputs[s] == outputs[sizes[0]] for s in sizes)}
    finally:
        await runtime.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,16,32", help="max_batch values; the first is the baseline")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mixed-rounds", type=int, default=2, help="rounds of the race-shaped workload (0: skip)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.batches.split(",")]
    torch.set_num_threads(1)
    model_dir = ensure_embedded_model()
    results = asyncio.run(measure(model_dir, sizes, args.rounds)) if args.rounds else {}
    for name, r in results.items():
        base = min(r["seconds"][str(sizes[0])])
        cells = []
        for size in sizes:
            best = min(r["seconds"][str(size)])
            cells.append(f"max_batch {size}: {best:.1f} s ({r['requests'] / best:.2f} answers/s, "
                         f"{base / best:.2f}x)")
        print(f"{name} ({r['requests']} requests, same tokens in every setting: {r['same_tokens']}): " + "; ".join(cells))
    settings = [("one load a batch, max_batch 8", False, 8)] + [(f"loads mixed, max_batch {n}", True, n) for n in sizes]
    race_shape = asyncio.run(mixed(model_dir, settings, args.mixed_rounds)) if args.mixed_rounds else {}
    if race_shape:
        base = race_shape[settings[0][0]]
        base_live = max(r["live_per_second"] for r in base)
        base_gate = min(r["gate_seconds"] for r in base)
        for name, runs in race_shape.items():
            live, gate = max(r["live_per_second"] for r in runs), min(r["gate_seconds"] for r in runs)
            print(f"gate + 8 live clients, {name}: gate {gate:.1f} s ({base_gate / gate:.2f}x), live "
                  f"{live:.2f} answers/s ({live / base_live:.2f}x) (best of {len(runs)})")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"benchmark": "batch_size", "machine": {"cpus": os.cpu_count(),
                                                                     "platform": platform.platform()},
                               "batches": sizes, "rounds": args.rounds, "results": results,
                               "race_shape": race_shape}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
