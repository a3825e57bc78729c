"""What training on samples a candidate old costs per step: the bare loop, pipelined as Reef is.

Reef's learner makes a candidate of K optimiser steps on the newest K x 8 samples, and those
were sampled by what served meanwhile: the candidate it trains on from (lag 0) or, for the
samples that arrived while that one was training, the candidate before it (lag 1, K to 2K - 1
steps behind the weights). This runs bench/bare_loop.py's on-policy loop with that structure and
nothing else of Reef (no server, no gate): per round, sample K batches of 8 with the weights of
L candidates ago, then take K clipped policy-gradient steps on them from the current weights,
with the loss either masking tokens whose ratio left the clip range (`mask`: `clipped_is`) or
PPO's clipped surrogate over every token (`nomask`: `ppo` without the dual clip), or weighting
every token's gradient by its ratio truncated at the clip's top (`cispo`). Test success
(bench/learning_race.py's evaluation) after 24, 48, 72... steps. K=1 L=0 is the bare loop.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/staleness.py [--task sentence] [--steps 72]
        [--variants 1:0:mask,6:1:mask,6:1:nomask] [--seeds 1] [--first-seed 0]

`--seeds N` runs each variant N times (seed k seeds the questions and the sampling); a
variant's take-off varies by tens of steps from run to run, so one seed shows large differences
only (docs/learning.md). Not in CI. Writes bench/results/staleness_<task>.json (per variant, a
curve per seed).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import torch  # noqa: E402

import bare_loop  # noqa: E402
from learning_race import LEARNING_RATE, evaluate_by_kind, kinds_text, log, race_task  # noqa: E402

BATCH = 8
EPS_CLIP, EPS_CLIP_HIGH = 0.2, 0.28  # the sao recipe's defaults


def run_variant(model, tokenizer, task, fresh, steps_per_candidate: int, lag: int, loss: str,  # type: ignore[no-untyped-def]
                total_steps: int, seed: int = 0,
                temperature: float = 1.0, eps_clip_high: float = EPS_CLIP_HIGH) -> tuple[dict[int, float], dict[int, dict[str, float]]]:
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, fresh)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE, weight_decay=0.0)
    torch.manual_seed(seed)  # the sampling, and with `rng` the questions: one seed, one run
    rng, train = random.Random(seed), task.module.train_tasks()
    candidates = [bare_loop.adapter_weights(model)]  # the weights after each candidate
    eval_at = {s for s in range(24, total_steps + 1, 24)}
    baseline, steps, curve, kinds, started = None, 0, {}, {}, time.monotonic()
    outside: list[float] = []
    while steps < total_steps:
        current = bare_loop.adapter_weights(model)
        set_peft_model_state_dict(model, candidates[max(0, len(candidates) - 1 - lag)])  # what served
        batches = []
        for _ in range(steps_per_candidate):
            chosen = [rng.choice(train) for _ in range(BATCH)]
            prompts = [bare_loop.prompt_ids(tokenizer, task.module.messages(t)) for t in chosen]
            comps, old, finish = bare_loop.generate(model, prompts, temperature, task.traffic_max_tokens)
            scores = [task.module.score(t, bare_loop.decode(tokenizer, c), f) for t, c, f in zip(chosen, comps, finish)]
            batches.append((prompts, comps, old, scores))
        set_peft_model_state_dict(model, current)
        for prompts, comps, old, scores in batches:
            baseline = sum(scores) / len(scores) if baseline is None else baseline
            advantages = []
            for s in scores:  # bare_loop's EMA baseline, as Reef's sao keeps it
                advantages.append(s - baseline)
                baseline = 0.9 * baseline + 0.1 * s
            step = bare_loop.pg_step(model, opt, prompts, comps, old, advantages, temperature,
                                     eps=(EPS_CLIP, eps_clip_high), loss=loss)
            outside.append(step["outside_clip"])
            steps += 1
            if steps in eval_at:
                weights = bare_loop.adapter_weights(model)
                by_kind = evaluate_by_kind(model, tokenizer, weights, task)
                curve[steps], kinds[steps] = by_kind["all"], by_kind
                set_peft_model_state_dict(model, weights)
                log(f"K={steps_per_candidate} L={lag} {loss} eps_clip_high {eps_clip_high} seed {seed}: step {steps}: test {100 * curve[steps]:.1f}% "
                    f"({kinds_text(by_kind)}) "
                    f"(tokens outside the clip range, last 24 steps: {100 * sum(outside[-24:]) / 24:.1f}%; "
                    f"{time.monotonic() - started:.0f} s)")
        candidates.append(bare_loop.adapter_weights(model))
    return curve, kinds


def parse_variant(variant: str) -> tuple[int, int, str, float]:
    """"K:L:loss[:E]" -> (K, L, loss, eps_clip_high); ValueError if it is not one."""
    parts = variant.split(":")
    if len(parts) not in (3, 4) or parts[2] not in ("mask", "nomask", "cispo"):
        raise ValueError(variant)
    eps_high = float(parts[3]) if len(parts) == 4 else EPS_CLIP_HIGH
    if int(parts[0]) < 1 or int(parts[1]) < 0 or eps_high <= 0:
        raise ValueError(variant)
    return int(parts[0]), int(parts[1]), parts[2], eps_high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["demo", "sentence"], default="sentence")
    parser.add_argument("--steps", type=int, default=72, help="optimiser steps per variant")
    parser.add_argument("--variants", default="1:0:mask,6:1:mask,6:1:nomask",
                        help="K:L:mask|nomask|cispo[:E], comma-separated (K steps per candidate, samples L candidates "
                             "old, E the clip's top: eps_clip_high, default 0.28)")
    parser.add_argument("--seeds", type=int, default=1, help="runs of each variant (seeds F..F+N-1), interleaved")
    parser.add_argument("--first-seed", type=int, default=0, metavar="F", help="the first seed  [default: 0]")
    args = parser.parse_args()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    task = race_task(args.task)
    tokenizer, model = bare_loop.load_model()
    fresh = bare_loop.adapter_weights(model)
    variants = args.variants.split(",")
    for variant in variants:
        try:
            parse_variant(variant)
        except ValueError:
            parser.error(f"{variant}: expected K:L:mask, K:L:nomask or K:L:cispo, optionally :E (eps_clip_high)")
    results: dict[str, list[dict[int, float]]] = {v: [] for v in variants}
    by_kind: dict[str, list[dict[int, dict[str, float]]]] = {v: [] for v in variants}
    for seed in seeds:  # seed by seed, so a slower machine late in the run hits every variant alike
        for variant in variants:
            k, lag, loss, eps_high = parse_variant(variant)
            curve, kinds = run_variant(model, tokenizer, task, fresh, k, lag, loss, args.steps, seed,
                                       eps_clip_high=eps_high)
            results[variant].append(curve)
            by_kind[variant].append(kinds)
    out = ROOT / "bench" / "results" / f"staleness_{task.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "staleness", "task": task.name, "lr": LEARNING_RATE, "batch": BATCH,
                               "seeds": list(seeds), "test_success_by_step": results, "by_kind_by_step": by_kind}, indent=1))
    at = range(24, args.steps + 1, 24)
    print(f"{'variant':>16} " + " ".join(f"{s:>7}" for s in at))
    for variant, curves in results.items():
        for seed, curve in zip(seeds, curves):
            print(f"{variant + ' s' + str(seed):>16} " + " ".join(f"{100 * curve.get(s, float('nan')):6.1f}%" for s in at))
        if len(curves) > 1:
            print(f"{variant + ' mean':>16} " + " ".join(
                f"{100 * sum(c.get(s, float('nan')) for c in curves) / len(curves):6.1f}%" for s in at))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
