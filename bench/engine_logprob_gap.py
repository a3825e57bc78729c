"""How far apart are the engine's behaviour log-probs and the trainer's, on real traffic?

The importance ratio of every trained token is exp(trainer log-prob - recorded log-prob). On the
embedded runtime both sides are the same fp32 weights and kernels, so the ratio is 1 to 1e-3
before any update (the baseline, measured in the same run). On vLLM the engine's kernels and
dtype differ from the trainer's; this measures by how much, on SmolLM2-135M-Instruct:

  for each runtime (embedded, then vLLM at each --vllm-dtype): start `reef serve` on it with
  learning off, send the demo's questions (temperature 1.0 and 0.7, 16 tokens), then recompute
  every recorded completion's log-probs with the trainer (`LoRATrainer`, fp32 on the CPU, the
  learner's default) and compare per token: mean and max |difference|, and the fraction of
  tokens the `sao` clip (ratio outside (1 - 0.2, 1 + 0.28)) masks out before any training step.

Run on its own (not in CI; it needs the vLLM environment, `scripts/setup --vllm`):

    .venv/bin/python bench/engine_logprob_gap.py [--requests 48] [--vllm-dtype bfloat16 float32]

Prints a table and writes bench/results/engine_logprob_gap.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx  # noqa: E402
import yaml  # noqa: E402

from reef.demo import tasks as demo_tasks  # noqa: E402
from reef.demo.server import DemoServer, free_port  # noqa: E402

EPS_CLIP, EPS_CLIP_HIGH = 0.2, 0.28  # the sao recipe's defaults
TEMPERATURES = (1.0, 0.7)


def settings(runtime: str, state_dir: Path, port: int, dtype: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "state_dir": str(state_dir),
        "runtime": runtime,
        "log_level": "warning",
        "learner": {"enabled": False},
        "embedded": {"default_max_tokens": 16},
    }
    if runtime == "vllm":
        config["vllm"] = {"dtype": dtype, "default_max_tokens": 16}
    return config


def traffic(url: str, requests: int) -> list[str]:
    """The demo's training questions at each temperature; the receipts."""
    questions = demo_tasks.train_tasks()[:requests]
    receipts = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for temperature in TEMPERATURES:
            for i, task in enumerate(questions):
                body = {
                    "model": "m",
                    "messages": demo_tasks.messages(task),
                    "temperature": temperature,
                    "max_tokens": 16,
                    "seed": i,
                }
                response = client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                receipts.append(response.headers["x-reef-agent-record-id"])
    return receipts


def serve_and_record(runtime: str, dtype: str | None, requests: int, work: Path) -> tuple[list[Any], float]:
    """Serve the traffic on one runtime; its records (read once the server stopped) and the time."""
    from reef.commit.state import ReefState

    port = free_port()
    config_path = work / f"{runtime}-{dtype}.yaml"
    state_dir = work / f"state-{runtime}-{dtype}"
    config_path.write_text(yaml.safe_dump(settings(runtime, state_dir, port, dtype)))
    server = DemoServer(config_path, port, work / f"{runtime}-{dtype}.log")
    server.start(timeout=900)
    try:
        started = time.monotonic()
        receipts = traffic(server.url, requests)
        seconds = time.monotonic() - started
    finally:
        server.stop()
    state = ReefState.open(state_dir)
    try:
        return [state.store.get_record(r) for r in receipts], seconds
    finally:
        state.close()


def gaps(records: list[Any], trainer: Any) -> dict[str, Any]:
    """Per-token |trainer - engine| and the clip's masked fraction, per temperature and overall."""
    from reef.grow.rollouts import rollout_of

    out: dict[str, Any] = {}
    every: list[float] = []
    for temperature in TEMPERATURES:
        samples = [rollout_of(r) for r in records if float(r.request.get("temperature")) == temperature and r.token_ids]
        ours = trainer.logprobs(None, [(s.prompt_ids, s.completion_ids) for s in samples], temperature)
        diffs = [t - e for s, row in zip(samples, ours) for t, e in zip(row, s.behaviour_logprobs)]
        out[f"temperature_{temperature}"] = summary(diffs)
        every += diffs
    out["all"] = summary(every)
    return out


def summary(diffs: list[float]) -> dict[str, float]:
    if not diffs:
        return {"tokens": 0}
    absolute = sorted(abs(d) for d in diffs)
    masked = sum(1 for d in diffs if not (1 - EPS_CLIP < math.exp(d) < 1 + EPS_CLIP_HIGH))
    return {
        "tokens": len(diffs),
        "mean_abs": sum(absolute) / len(absolute),
        "max_abs": absolute[-1],
        "p99_abs": absolute[int(0.99 * (len(absolute) - 1))],
        "mean_signed": sum(diffs) / len(diffs),
        "clip_masked_fraction": masked / len(diffs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=48, help="questions per temperature")
    parser.add_argument("--vllm-dtype", nargs="*", default=["bfloat16", "float32"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "engine_logprob_gap.json")
    args = parser.parse_args()
    from reef.grow.trainer import LoRATrainer
    from reef.runtimes.model_files import default_cache_dir, ensure_embedded_model

    model_dir = ensure_embedded_model(default_cache_dir(), print)
    runs: list[tuple[str, str | None]] = [("embedded", None)] + [("vllm", d) for d in args.vllm_dtype]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="reef-bench-gap-") as work:
        recorded = {}
        for runtime, dtype in runs:
            label = runtime if dtype is None else f"vllm-{dtype}"
            print(f"serving {2 * args.requests} requests on {label} ...", flush=True)
            recorded[label] = serve_and_record(runtime, dtype, args.requests, Path(work))
        trainer = LoRATrainer(model_dir, threads=os.cpu_count())  # fp32 on the CPU: learner.device/dtype auto
        for label, (records, seconds) in recorded.items():
            results[label] = {"requests": len(records), "serve_seconds": round(seconds, 1), **gaps(records, trainer)}
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "engine_logprob_gap",
                "model": "SmolLM2-135M-Instruct",
                "trainer": "LoRATrainer fp32 CPU",
                "clip": [EPS_CLIP, EPS_CLIP_HIGH],
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


def table(results: dict[str, Any]) -> str:
    base = results.get("embedded", {}).get("all", {}).get("mean_abs") or None
    lines = [
        "| runtime | tokens | mean abs | p99 abs | max abs | masked by the clip | mean abs vs embedded |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, row in results.items():
        a = row["all"]
        ratio = f"{a['mean_abs'] / base:.0f}x" if base and label != "embedded" else "1x"
        lines.append(
            f"| {label} | {a['tokens']} | {a['mean_abs']:.4f} | {a['p99_abs']:.4f} | {a['max_abs']:.4f} | "
            f"{100 * a['clip_masked_fraction']:.2f}% | {ratio} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
