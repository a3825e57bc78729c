"""Would the gate see a line's candidate beat the head? Off the clock, after a `--line` race.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/gate_power.py WORKDIR RACE.json 8 11 13 14 15 [--samples 8]

WORKDIR and RACE.json are a `bench/learning_race.py --line --workdir WORKDIR --out RACE.json` run.
The head at the end of the run and the line's newest candidate at each given minute answer the
demo task's gate questions (reef.demo.tasks' held-out ones) two ways: greedily, one answer a task
(the gate's measure), and `--samples` answers a task at temperature 1, scored as the share right.
Each way, task by task, counts where the candidate did better and worse than the head, with the
one-sided sign test's p (the gate selects at its final look at p <= 0.15 with its defaults).
docs/learning_race.md ("The line the learner trains, beside the head") has a run's figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bare_loop  # noqa: E402
from learning_race import _release_weights  # noqa: E402
from reef.core.sign_test import sign_test_p  # noqa: E402
from reef.demo import tasks  # noqa: E402

GATE_MAX_TOKENS = 8  # the demo's gate.max_tokens


def per_task(model, tokenizer, weights, temperature: float, samples: int) -> list[float]:  # type: ignore[no-untyped-def]
    """Each gate task's share of `samples` answers the gate's scorer passes."""
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, weights)
    gate_tasks = tasks.heldout_tasks()
    rows = [(i, bare_loop.prompt_ids(tokenizer, tasks.messages(t))) for i, t in enumerate(gate_tasks)
            for _ in range(samples)]
    share = [0.0] * len(gate_tasks)
    for start in range(0, len(rows), 64):
        chunk = rows[start:start + 64]
        comps, _, _ = bare_loop.generate(model, [p for _, p in chunk], temperature, GATE_MAX_TOKENS)
        for (i, _), comp in zip(chunk, comps):
            share[i] += tasks.gate_score(gate_tasks[i], bare_loop.decode(tokenizer, comp)) / samples
    return share


def compared(candidate: list[float], head: list[float]) -> str:
    wins = sum(c > h + 1e-9 for c, h in zip(candidate, head))
    losses = sum(c < h - 1e-9 for c, h in zip(candidate, head))
    return f"{sum(candidate) / len(candidate):.3f} {wins}-{losses} p={sign_test_p(wins, losses):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("race", type=Path)
    parser.add_argument("minutes", type=float, nargs="+")
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    import torch
    from safetensors.torch import load_file

    record = json.loads(args.race.read_text())
    snapshots = record["arms"]["reef"]["snapshots"]
    head_id, started = snapshots[-1]["release_id"], snapshots[0]["wall"]
    tokenizer, model = bare_loop.load_model()
    torch.manual_seed(0)
    head = _release_weights(args.workdir / "state", {head_id})[head_id]
    assert head is not None, "the run ended on the base model: no head to compare with"
    made = sorted((float(p.stem), p) for p in (args.workdir / "line").glob("*.safetensors"))
    head_greedy = per_task(model, tokenizer, head, 0.0, 1)
    head_sampled = per_task(model, tokenizer, head, 1.0, args.samples)
    print(f"head {head_id[:12]}: greedy {sum(head_greedy) / len(head_greedy):.3f}, "
          f"sampled {sum(head_sampled) / len(head_sampled):.3f}")
    for minute in args.minutes:
        newest = [path for second, path in made if second <= started + 60 * minute]
        if not newest:
            print(f"line at {minute:4.1f}: no candidate yet")
            continue
        weights = load_file(newest[-1])
        print(f"line at {minute:4.1f}: greedy {compared(per_task(model, tokenizer, weights, 0.0, 1), head_greedy)} | "
              f"sampled x{args.samples} {compared(per_task(model, tokenizer, weights, 1.0, args.samples), head_sampled)}",
              flush=True)


if __name__ == "__main__":
    main()
