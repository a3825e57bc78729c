"""Continuous batching in the embedded runtime, measured in the learning race's shape.

8 live clients ask training questions one after another (temperature 1, at most
TRAFFIC_MAX_TOKENS tokens) on one LoRA load (the serving release), while a gate judges another
LoRA load (a candidate) on the sentence task's 92 held-out tasks in 3 looks (each look's ~31
requests at once, greedy, at most EVAL_MAX_TOKENS tokens); bench/race_tasks.py's prompts,
SmolLM2-135M-Instruct, torch with one thread (what `reef serve` gives the runtime on a 2-core
machine while the learner trains on the other). The adapters are peft's fresh ones (B = 0: the
base model's answers, through the LoRA path).

Settings, alternated `--rounds` times: `static` (the baseline: a batch runs from start to end,
joined by nothing; loads take turns batch by batch) and continuous batching with each
`--turn-steps` value (requests join their load's batch between steps; loads take turns every
that many steps while another has work), at each `--max-batch`. Measured: the gate's seconds (and each look's), live
answers a second meanwhile, live answers' latency. Prints the median of the rounds and ratios
against `static`; checks the gate's greedy answers are the same tokens in every setting. Writes
bench/results/continuous_batching.json.

Then an agent's shape, on one load: 4 long answers decoding (a story each, temperature 1, up to
LONG_TOKENS tokens) when 4 short questions arrive one every half second: how long a short one
waits for its first token and for its answer, and how long the longest long answer takes.

Then the race's traffic as Reef serves it while it learns: 8 live clients on the newest candidate
(a canary), a new candidate loaded every `--churn-every` seconds and each old one unloaded once
its last request ends, for CHURN_SECONDS: live answers a second and their latency.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/continuous_batching.py [--turn-steps 8,16,32] [--max-batch 8,16]
        [--rounds 3] [--churn-every 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import race_tasks  # noqa: E402
import torch  # noqa: E402
from batch_size import requests  # noqa: E402

from reef.core.chat import ChatRequest, ChatResult, Message  # noqa: E402
from reef.core.types import ReleaseRef  # noqa: E402
from reef.runtimes.embedded import EmbeddedRuntime  # noqa: E402
from reef.runtimes.model_files import ensure_embedded_model  # noqa: E402

OUT = ROOT / "bench" / "results" / "continuous_batching.json"
CLIENTS = 8
LONG_TOKENS = 200
CHURN_SECONDS = 40.0


def fresh_adapter(model_dir: Path, folder: Path) -> dict[str, bytes]:
    """A peft LoRA adapter shaped as `sao`'s (B = 0), as release bytes."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from reef.recipes.sao import SAOConfig

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(
        r=SAOConfig().lora_r, lora_alpha=SAOConfig().lora_alpha, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    get_peft_model(base, config).save_pretrained(str(folder))
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


async def answer(runtime: EmbeddedRuntime, request: ChatRequest, load: str) -> list[int]:
    result = ChatResult()
    async for delta in runtime.generate(request, ReleaseRef("r", "c", load)):
        result.add(delta)
    return list(result.token_ids)


async def gate_with_live_traffic(runtime: EmbeddedRuntime, live_load: str, gate_load: str) -> dict[str, Any]:
    gate = requests(race_tasks.heldout_tasks(), 0.0, race_tasks.EVAL_MAX_TOKENS)
    live = requests(race_tasks.train_tasks(), 1.0, race_tasks.TRAFFIC_MAX_TOKENS)
    done = asyncio.Event()
    latencies: list[float] = []

    async def client(k: int) -> None:
        i = k
        while not done.is_set():
            started = time.perf_counter()
            await answer(runtime, live[i % len(live)], live_load)
            if not done.is_set() and counting:
                latencies.append(time.perf_counter() - started)
            i += CLIENTS

    counting = False
    clients = [asyncio.create_task(client(k)) for k in range(CLIENTS)]
    await asyncio.sleep(1.0)  # the live clients are going
    counting, started = True, time.perf_counter()
    looks, outputs = [], []
    for look in (gate[:31], gate[31:62], gate[62:]):
        look_started = time.perf_counter()
        outputs += await asyncio.gather(*(answer(runtime, r, gate_load) for r in look))
        looks.append(time.perf_counter() - look_started)
    seconds = time.perf_counter() - started
    done.set()
    await asyncio.gather(*clients)
    return {
        "gate_seconds": seconds,
        "look_seconds": looks,
        "live_answers": len(latencies),
        "live_per_second": len(latencies) / seconds,
        "live_latency_p50": statistics.median(latencies) if latencies else None,
        "live_latency_p90": statistics.quantiles(latencies, n=10)[-1] if len(latencies) > 1 else None,
        "gate_tokens": outputs,
    }


async def live_with_churn(
    runtime: EmbeddedRuntime, files: dict[str, bytes], seconds: float, every: float
) -> dict[str, Any]:
    """The race's traffic as Reef serves it while it learns: 8 live clients on the newest
    candidate (a canary), a new candidate loaded every `every` seconds, each old one unloaded
    once its last request ends; no gate. Live answers a second and their latency."""
    live = requests(race_tasks.train_tasks(), 1.0, race_tasks.TRAFFIC_MAX_TOKENS)
    loads = [await runtime.load("canary-0", files)]
    in_flight: dict[str, int] = {}
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def retire(load: str) -> None:
        while in_flight.get(load):
            await asyncio.sleep(0.05)
        await runtime.unload(load)

    async def client(k: int) -> None:
        i = k
        while time.perf_counter() < deadline:
            load, started = loads[-1], time.perf_counter()
            in_flight[load] = in_flight.get(load, 0) + 1
            try:
                await answer(runtime, live[i % len(live)], load)
            finally:
                in_flight[load] -= 1
            latencies.append(time.perf_counter() - started)
            i += CLIENTS

    async def churn() -> None:
        retiring = []
        while time.perf_counter() + every < deadline:
            await asyncio.sleep(every)
            loads.append(await runtime.load(f"canary-{len(loads)}", files))
            retiring.append(asyncio.create_task(retire(loads[-2])))
        await asyncio.gather(*retiring)

    started = time.perf_counter()
    await asyncio.gather(churn(), *(client(k) for k in range(CLIENTS)))
    elapsed = time.perf_counter() - started
    await runtime.unload(loads[-1])
    return {
        "churn_live_per_second": len(latencies) / elapsed,
        "churn_loads": len(loads),
        "churn_latency_p50": statistics.median(latencies),
        "churn_latency_p90": statistics.quantiles(latencies, n=10)[-1],
    }


async def short_behind_long(runtime: EmbeddedRuntime, load: str) -> dict[str, Any]:
    """An agent's shape on one load: 4 long answers (a story, temperature 1, up to LONG_TOKENS
    tokens) are decoding when 4 short questions (the gate's, greedy) arrive one every 0.5 s: how
    long each short one waits for its first token and for its answer, and the long ones for theirs."""
    long = [
        ChatRequest(
            model="m",
            dialect="openai",
            temperature=1.0,
            max_tokens=LONG_TOKENS,
            seed=i,
            messages=(Message("user", f"Tell me a long story about the sea, number {i}."),),
        )
        for i in range(4)
    ]
    short = requests(race_tasks.heldout_tasks()[:4], 0.0, race_tasks.EVAL_MAX_TOKENS)

    async def timed(request: ChatRequest) -> tuple[float, float, int]:
        started, first, tokens = time.perf_counter(), None, 0
        async for delta in runtime.generate(request, ReleaseRef("r", "c", load)):
            first = first or time.perf_counter()
            tokens += len(getattr(delta, "token_ids", ()))
        return first - started, time.perf_counter() - started, tokens

    longs = [asyncio.create_task(timed(r)) for r in long]
    await asyncio.sleep(1.0)  # the long answers are decoding
    shorts = []
    for request in short:
        shorts.append(asyncio.create_task(timed(request)))
        await asyncio.sleep(0.5)
    short_times, long_times = await asyncio.gather(*shorts), await asyncio.gather(*longs)
    return {
        "short_first_token_p50": statistics.median(t[0] for t in short_times),
        "short_first_token_max": max(t[0] for t in short_times),
        "short_answer_p50": statistics.median(t[1] for t in short_times),
        "long_answer_max": max(t[1] for t in long_times),
        "long_tokens": [t[2] for t in long_times],
    }


async def measure(
    model_dir: Path, settings: list[tuple[str, bool, int, int]], rounds: int, churn_every: float
) -> dict[str, list[dict[str, Any]]]:
    runtime = EmbeddedRuntime(model_dir, threads=1)
    await runtime.start()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in settings}
    try:
        with tempfile.TemporaryDirectory() as folder:
            files = fresh_adapter(model_dir, Path(folder))
        live_load, gate_load = await runtime.load("serving", files), await runtime.load("candidate", files)
        for r in range(rounds):
            for name, continuous, steps, max_batch in settings:
                runtime.continuous, runtime.turn_steps, runtime.max_batch = continuous, steps, max_batch
                run = await gate_with_live_traffic(runtime, live_load, gate_load)
                run["short_behind_long"] = await short_behind_long(runtime, live_load)
                run.update(await live_with_churn(runtime, files, CHURN_SECONDS, churn_every))
                runs[name].append(run)
                print(
                    f"round {r + 1} {name:>18}: gate {run['gate_seconds']:6.1f} s, "
                    f"live {run['live_per_second']:.2f}/s; a short answer behind long ones "
                    f"{run['short_behind_long']['short_answer_p50']:.1f} s; "
                    f"live on a new candidate every {churn_every:g} s {run['churn_live_per_second']:.2f}/s",
                    flush=True,
                )
    finally:
        await runtime.close()
    return runs


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[name])

    summary = {}
    for name in runs:
        summary[name] = {
            key: median(name, key)
            for key in (
                "gate_seconds",
                "live_per_second",
                "live_latency_p50",
                "live_latency_p90",
                "churn_live_per_second",
                "churn_latency_p50",
                "churn_latency_p90",
            )
        }
        for key in runs[name][0]["short_behind_long"]:
            if key != "long_tokens":
                summary[name][key] = statistics.median(run["short_behind_long"][key] for run in runs[name])
        summary[name]["look_seconds"] = [
            statistics.median(run["look_seconds"][i] for run in runs[name]) for i in range(3)
        ]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turn-steps", default="8,16,32", help="continuous settings to measure (comma-separated)")
    parser.add_argument(
        "--max-batch", default="8", help="embedded.max_batch of the continuous settings (comma-separated; static: 8)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--churn-every",
        type=float,
        default=8.0,
        help="seconds between candidates in the churn shape (the race: about 8)",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    model_dir = ensure_embedded_model(Path.home() / ".cache" / "reef")
    settings = [("static", False, 16, 8)] + [
        (f"continuous/{n} b{b}", True, int(n), int(b))
        for b in args.max_batch.split(",")
        for n in args.turn_steps.split(",")
    ]
    runs = asyncio.run(measure(model_dir, settings, args.rounds, args.churn_every))
    reference = runs["static"][0]["gate_tokens"]
    same_tokens = {name: all(run["gate_tokens"] == reference for run in rs) for name, rs in runs.items()}
    summary = summarise(runs)
    base = summary["static"]
    print(
        f"\n{'setting':>18} {'gate s':>7} {'x':>5} {'looks s':>18} {'live/s':>7} {'x':>5} "
        f"{'p50 s':>6} {'p90 s':>6}  gate answers same"
    )
    for name, s in summary.items():
        looks = "/".join(f"{x:.0f}" for x in s["look_seconds"])
        print(
            f"{name:>18} {s['gate_seconds']:7.1f} {s['gate_seconds'] / base['gate_seconds']:5.2f} {looks:>18} "
            f"{s['live_per_second']:7.2f} {s['live_per_second'] / base['live_per_second']:5.2f} "
            f"{s['live_latency_p50']:6.2f} {s['live_latency_p90']:6.2f}  {same_tokens[name]}"
        )
    print(
        f"\nA short answer behind 4 long ones ({LONG_TOKENS} tokens), on one load (seconds):\n"
        f"{'setting':>18} {'first token p50':>16} {'max':>6} {'answer p50':>11} {'x':>5} {'longest long':>13} {'x':>5}"
    )
    for name, s in summary.items():
        print(
            f"{name:>18} {s['short_first_token_p50']:16.2f} {s['short_first_token_max']:6.2f} "
            f"{s['short_answer_p50']:11.2f} {s['short_answer_p50'] / base['short_answer_p50']:5.2f} "
            f"{s['long_answer_max']:13.1f} {s['long_answer_max'] / base['long_answer_max']:5.2f}"
        )
    print(
        f"\nLive traffic on a new candidate every {args.churn_every:g} s ({CHURN_SECONDS:g} s, no gate):\n"
        f"{'setting':>18} {'live/s':>7} {'x':>5} {'p50 s':>6} {'p90 s':>6}"
    )
    for name, s in summary.items():
        print(
            f"{name:>18} {s['churn_live_per_second']:7.2f} "
            f"{s['churn_live_per_second'] / base['churn_live_per_second']:5.2f} "
            f"{s['churn_latency_p50']:6.2f} {s['churn_latency_p90']:6.2f}"
        )
    for rs in runs.values():
        for run in rs:
            del run["gate_tokens"]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(),
                "torch_threads": 1,
                "clients": CLIENTS,
                "rounds": args.rounds,
                "summary": summary,
                "same_gate_tokens": same_tokens,
                "runs": runs,
            },
            indent=2,
        )
    )
    print(f"\nwrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
