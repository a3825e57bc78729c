"""How many tasks a job of the training process should answer for the gate (`gate.answer_on:
trainer`): the seconds the trainer takes to answer the gate's tasks in jobs of 8, 16 and 32, on
the demo's and the learning race's sentence task, and whether every job size gives the same text.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/gate_jobs.py [--rounds 2] [--prompts 64]

One torch thread (the trainer's share of a 2-core machine), SmolLM2-135M-Instruct, greedy, the
base model. The gate sends jobs of `reef.commit.gate.TRAINER_JOB` tasks; the trainer decodes up
to `reef.grow.trainer.GENERATE_BATCH` rows together. Prints seconds (best of the rounds) and the
ratio to jobs of 8; writes bench/results/gate_jobs.json. Not in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import race_tasks as sentence  # noqa: E402
import torch  # noqa: E402
from shared_prefix import request  # noqa: E402

from reef.commit.gate import TRAINER_JOB  # noqa: E402
from reef.core.chat import ChatRequest  # noqa: E402
from reef.demo import tasks as demo  # noqa: E402
from reef.grow.trainer import GENERATE_BATCH, LoRATrainer  # noqa: E402
from reef.runtimes.model_files import ensure_embedded_model  # noqa: E402

OUT = ROOT / "bench" / "results" / "gate_jobs.json"
JOB_SIZES = (8, 16, 32)


def answer_in_jobs(
    trainer: LoRATrainer, requests: list[ChatRequest], job: int, max_tokens: int
) -> tuple[float, list[str]]:
    started = time.perf_counter()
    texts = [
        text
        for start in range(0, len(requests), job)
        for text in trainer.generate(None, requests[start : start + job], max_tokens)
    ]
    return time.perf_counter() - started, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=64, help="the gate's tasks answered, per task and job size")
    args = parser.parse_args()
    torch.set_num_threads(1)
    trainer = LoRATrainer(ensure_embedded_model(), threads=1)
    results = {}
    for name, module, max_tokens in (("demo", demo, 8), ("sentence", sentence, sentence.EVAL_MAX_TOKENS)):
        requests = [request(t, module, max_tokens) for t in module.heldout_tasks()[: args.prompts]]
        trainer.generate(None, requests[:8], max_tokens)  # warm-up
        seconds: dict[int, list[float]] = {job: [] for job in JOB_SIZES}
        texts: dict[int, list[str]] = {}
        for _ in range(args.rounds):
            for job in JOB_SIZES:  # interleaved, so a slower machine late in the run hits every size alike
                took, texts[job] = answer_in_jobs(trainer, requests, job, max_tokens)
                seconds[job].append(took)
        best = {job: min(s) for job, s in seconds.items()}
        results[name] = {
            "prompts": len(requests),
            "max_tokens": max_tokens,
            "seconds": seconds,
            "same_text": all(texts[job] == texts[JOB_SIZES[0]] for job in JOB_SIZES),
        }
        print(
            f"{name} ({len(requests)} tasks, at most {max_tokens} tokens; best of {args.rounds}): "
            + ", ".join(f"jobs of {job} {best[job]:.1f} s ({best[JOB_SIZES[0]] / best[job]:.2f}x)" for job in JOB_SIZES)
            + f"; the same text: {results[name]['same_text']}"
        )
    print(f"the gate sends jobs of {TRAINER_JOB}; the trainer decodes up to {GENERATE_BATCH} rows together")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "benchmark": "gate_jobs",
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "trainer_job": TRAINER_JOB,
                "generate_batch": GENERATE_BATCH,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
