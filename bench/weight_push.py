"""Seconds from "candidate selected" to "first token served by it": a full-weight release against
a LoRA adapter, on the embedded runtime and on vLLM (the CPU build here).

"Candidate selected" is the moment the publisher hands the release's files to `Runtime.load`
(after the gate's verdict, the content read from the artifact store); "first token served by it"
is the first token of a greedy request frozen to that load. Each repeat loads a fresh copy (new
load id), times load + first token, and unloads it. The LoRA adapter (r=4 on q, k, v, o, up,
down) and the full weights (layer 1 perturbed, one shard per layer) are made from the model
itself (tests/helpers). Ratios are against LoRA measured in the same run, on the same runtime.

    .venv/bin/python bench/weight_push.py --model ~/.cache/reef/smollm2-135m-instruct-fp32 \\
        --runtimes embedded,vllm --repeats 3 --out bench/results/weight_push.json

`--model tiny` builds the tiny test model (and, for vLLM, its head_dim-32 twin).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from reef.core.chat import ChatRequest, Message, TextDelta  # noqa: E402
from reef.core.types import ReleaseRef  # noqa: E402
from reef.runtimes.base import Runtime  # noqa: E402

ASK = ChatRequest(
    model="m", messages=(Message("user", "Name a colour."),), dialect="openai", temperature=0, max_tokens=4
)


async def first_token(runtime: Runtime, load_id: str) -> None:
    async for delta in runtime.generate(ASK, ReleaseRef("bench", "bench", load_id)):
        if isinstance(delta, TextDelta) and delta.token_ids:
            return


async def time_pushes(runtime: Runtime, files: Mapping[str, bytes], repeats: int) -> list[float]:
    """Load + first token, `repeats` times (after one untimed warm-up), each load unloaded after."""
    seconds = []
    for i in range(repeats + 1):
        started = time.monotonic()
        load_id = await runtime.load(f"candidate-{i}", files)
        await first_token(runtime, load_id)
        if i:
            seconds.append(time.monotonic() - started)
        await runtime.unload(load_id)
    return seconds


def build_runtime(kind: str, model: Path, work: Path) -> Runtime:
    if kind == "embedded":
        from reef.runtimes.embedded import EmbeddedRuntime

        return EmbeddedRuntime(model, threads=os.cpu_count())
    from reef.runtimes.vllm import VLLMRuntime
    from reef.runtimes.vllm_env import VLLMProcess, default_env_dir

    process = VLLMProcess(
        default_env_dir() / "bin" / "python",
        model,
        "bench",
        args=["--enable-lora", "--max-lora-rank", "16", "--max-model-len", "1024", "--dtype", "float32"],
        env={"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
        log_path=work / "vllm.log",
        startup_timeout=600,
    )
    return VLLMRuntime(process=process, adapter_dir=work / "loads", load_timeout=600)


async def bench_runtime(kind: str, model: Path, work: Path, repeats: int) -> list[dict[str, Any]]:
    from tests.helpers.full_weights import full_weight_files
    from tests.helpers.lora import lora_files

    contents = {"lora": lora_files(model, work / f"lora-{kind}"), "full": full_weight_files(model)}
    runtime = build_runtime(kind, model, work)
    await runtime.start()
    try:
        base = await runtime.load("base", {})
        await first_token(runtime, base)  # warm
        rows = []
        for weights, files in contents.items():
            seconds = await time_pushes(runtime, files, repeats)
            size = sum(len(d) for n, d in files.items() if n.endswith(".safetensors") and "/" not in n)
            rows.append({"runtime": kind, "weights": weights, "bytes": size, "seconds": seconds})
        return rows
    finally:
        await runtime.close()


def model_dirs(spec: str, work: Path) -> dict[str, Path]:
    """The model per runtime: the folder given, or the tiny test model (vLLM's twin for vLLM)."""
    if spec != "tiny":
        folder = Path(spec).expanduser()
        return {"embedded": folder, "vllm": folder}
    from reef.runtimes.model_files import build_tiny_model
    from tests.helpers.vllm_model import build_vllm_tiny_model

    tiny = build_tiny_model(work / "tiny")
    return {"embedded": tiny, "vllm": build_vllm_tiny_model(tiny, work / "tiny-vllm")}


def summarise(rows: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """Median seconds per row, and its ratio to LoRA's on the same runtime."""
    for row in rows:
        row["median_s"] = round(statistics.median(row["seconds"]), 3)
        row["model"] = model
    for row in rows:
        lora = next(r for r in rows if r["runtime"] == row["runtime"] and r["weights"] == "lora")
        row["vs_lora"] = round(row["median_s"] / lora["median_s"], 2) if lora["median_s"] else None
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="a model folder, or `tiny` (built here)")
    parser.add_argument("--runtimes", default="embedded", help="comma-separated: embedded, vllm")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="reef-weight-push-") as tmp:
        models = model_dirs(args.model, Path(tmp))
        for kind in args.runtimes.split(","):
            rows += asyncio.run(bench_runtime(kind, models[kind], Path(tmp) / kind, args.repeats))
    rows = summarise(rows, args.model)
    print(f"{'runtime':<10}{'weights':<9}{'MB':>9}{'median s':>10}{'vs LoRA':>9}")
    for row in rows:
        print(
            f"{row['runtime']:<10}{row['weights']:<9}{row['bytes'] / 1e6:>9.1f}{row['median_s']:>10.3f}{row['vs_lora']:>9}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
