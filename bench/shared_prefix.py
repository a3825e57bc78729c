"""Shared-prefix forward passes (`reef/core/prefix.py`): what running a batch's common prompt
prefix once saves, in the embedded runtime's prefill and in the trainer's forward and backward.

On SmolLM2-135M-Instruct, torch with one thread, the demo's prompts (one worked example, then
the question: ~66 tokens, ~50 of them common to a batch):
- serving: 64 held-out questions, greedy, at most 8 tokens, batches of 8, through an
  `EmbeddedRuntime` with `min_shared_prefix` 0 (off) and 16 (the default), alternately, `--rounds`
  times each; the outputs must be the same tokens;
- training: `--steps` clipped-IS steps (forward, backward, AdamW) on 8 training questions with
  on-policy log-probs, from the same fresh adapter, with the feature off and on;
- the gate's answers on the trainer (`gate.answer_on: trainer`, `LoRATrainer.generate`): 64
  held-out questions of the demo (at most 8 tokens) and of the race's sentence task (20 tokens),
  in jobs of 8 (`WARM_CHUNK`; the gate's jobs on the trainer were of 8 until 2026-12-06, now
  `TRAINER_JOB`: bench/gate_jobs.py), off and on alternately, `--rounds` times
  each; the answers must be the same text.
Prints seconds and the ratio off/on for each; writes bench/results/shared_prefix.json.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/shared_prefix.py [--rounds 2] [--steps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from reef.commit.gate import WARM_CHUNK  # noqa: E402
from reef.core.chat import ChatRequest, ChatResult, Message  # noqa: E402
from reef.core.prefix import MIN_SHARED_PREFIX  # noqa: E402
from reef.core.training import Rollout, TrainConfig  # noqa: E402
from reef.core.types import ReleaseRef  # noqa: E402
from reef.demo import tasks as demo  # noqa: E402
from reef.grow.trainer import LoRATrainer  # noqa: E402
from reef.runtimes.embedded import EmbeddedRuntime  # noqa: E402
from reef.runtimes.model_files import ensure_embedded_model  # noqa: E402

OUT = ROOT / "bench" / "results" / "shared_prefix.json"


def request(task: dict[str, Any], module: Any = demo, max_tokens: int = 8) -> ChatRequest:
    return ChatRequest(
        model="m",
        dialect="openai",
        temperature=0,
        max_tokens=max_tokens,
        messages=tuple(Message(m["role"], m["content"]) for m in module.messages(task)),
    )


async def serve_once(runtime: EmbeddedRuntime, load: str, requests: list[ChatRequest]) -> tuple[float, list[list[int]]]:
    async def one(req: ChatRequest) -> list[int]:
        result = ChatResult()
        async for delta in runtime.generate(req, ReleaseRef("r", "c", load)):
            result.add(delta)
        return list(result.token_ids)

    started = time.perf_counter()
    with runtime.paused():  # queue them all, so batches are full
        tasks = [asyncio.create_task(one(r)) for r in requests]
        await asyncio.sleep(0.05)
    outputs = await asyncio.gather(*tasks)
    return time.perf_counter() - started, outputs


async def serving(model_dir: Path, rounds: int) -> dict[str, Any]:
    runtime = EmbeddedRuntime(model_dir, threads=1, max_batch=8)
    await runtime.start()
    try:
        load = await runtime.load("base", {})
        requests = [request(t) for t in demo.heldout_tasks()[:64]]
        await serve_once(runtime, load, requests[:8])  # warm-up
        seconds: dict[int, list[float]] = {0: [], MIN_SHARED_PREFIX: []}
        outputs: dict[int, list[list[int]]] = {}
        for _ in range(rounds):
            for setting in seconds:
                runtime.min_shared_prefix = setting
                took, outputs[setting] = await serve_once(runtime, load, requests)
                seconds[setting].append(took)
        same = outputs[0] == outputs[MIN_SHARED_PREFIX]
    finally:
        await runtime.close()
    return {
        "prompts": len(requests),
        "seconds_off": seconds[0],
        "seconds_on": seconds[MIN_SHARED_PREFIX],
        "same_tokens": same,
    }


def training(model_dir: Path, steps: int) -> dict[str, Any]:
    import bare_loop
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    trainer = LoRATrainer(model_dir, threads=1)
    prompts = [bare_loop.prompt_ids(tokenizer, demo.messages(t)) for t in demo.train_tasks()[:8]]
    completions = [[100 + i, 200, 300, 400, 2] for i in range(8)]
    logprobs = trainer.logprobs(None, list(zip(prompts, completions)))  # on-policy: nothing masked at first
    samples = [
        Rollout(f"r{i}", "base", p, c, lp).datum(1.0 if i % 2 else -1.0)
        for i, (p, c, lp) in enumerate(zip(prompts, completions, logprobs))
    ]
    config = TrainConfig()
    seconds, losses = {}, {}
    for setting in (0, MIN_SHARED_PREFIX):
        trainer.min_shared_prefix = setting
        key = f"bench{setting}"
        trainer.load_state(key, None, config.lora)
        started = time.perf_counter()
        for _ in range(steps):
            metrics = trainer.forward_backward(key, samples, config.loss, config.loss_config)
            trainer.optim_step(key, config.adam)
        seconds[setting], losses[setting] = time.perf_counter() - started, metrics["loss"]
    return {
        "steps": steps,
        "seconds_off": seconds[0],
        "seconds_on": seconds[MIN_SHARED_PREFIX],
        "last_loss_off": losses[0],
        "last_loss_on": losses[MIN_SHARED_PREFIX],
    }


def gate_on_trainer(model_dir: Path, rounds: int) -> dict[str, Any]:
    import race_tasks as sentence

    trainer = LoRATrainer(model_dir, threads=1)
    results = {}
    for name, module, max_tokens in (("demo", demo, 8), ("sentence", sentence, sentence.EVAL_MAX_TOKENS)):
        requests = [request(t, module, max_tokens) for t in module.heldout_tasks()[:64]]
        chunks = [requests[i : i + WARM_CHUNK] for i in range(0, len(requests), WARM_CHUNK)]
        trainer.generate(None, chunks[0], max_tokens)  # warm-up
        seconds: dict[int, list[float]] = {0: [], MIN_SHARED_PREFIX: []}
        answers: dict[int, list[str]] = {}
        for _ in range(rounds):
            for setting in seconds:
                trainer.min_shared_prefix = setting
                started = time.perf_counter()
                answers[setting] = [a for chunk in chunks for a in trainer.generate(None, chunk, max_tokens)]
                seconds[setting].append(time.perf_counter() - started)
        results[name] = {
            "prompts": len(requests),
            "max_tokens": max_tokens,
            "seconds_off": seconds[0],
            "seconds_on": seconds[MIN_SHARED_PREFIX],
            "same_text": answers[0] == answers[MIN_SHARED_PREFIX],
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir = ensure_embedded_model()
    serve = asyncio.run(serving(model_dir, args.rounds))
    train = training(model_dir, args.steps)
    gate = gate_on_trainer(model_dir, args.rounds)
    off, on = min(serve["seconds_off"]), min(serve["seconds_on"])
    print(
        f"serving {serve['prompts']} prompts: off {off:.2f} s, on {on:.2f} s (best of {args.rounds}), "
        f"off/on {off / on:.2f}x, same tokens: {serve['same_tokens']}"
    )
    print(
        f"training {train['steps']} steps: off {train['seconds_off']:.2f} s, on {train['seconds_on']:.2f} s, "
        f"off/on {train['seconds_off'] / train['seconds_on']:.2f}x, last loss {train['last_loss_off']:.6f} vs "
        f"{train['last_loss_on']:.6f}"
    )
    for name, result in gate.items():
        off, on = min(result["seconds_off"]), min(result["seconds_on"])
        print(
            f"the gate's answers on the trainer, {name} ({result['prompts']} prompts, jobs of {WARM_CHUNK}, "
            f"at most {result['max_tokens']} tokens): off {off:.2f} s, on {on:.2f} s (best of {args.rounds}), "
            f"off/on {off / on:.2f}x, same text: {result['same_text']}"
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "benchmark": "shared_prefix",
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "serving": serve,
                "training": train,
                "gate_on_trainer": gate,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
