"""How many gate tasks does a gain need? The weights gate's own rule, simulated, no model.

    .venv/bin/python bench/gate_size.py [--trials 4000] [--out bench/results/gate_size.json]

A candidate and the serving release answer `n` tasks; on each, independently, the candidate does
better with chance `w`, worse with chance `l`, and the same otherwise (`untied` = w + l: how many
answers a candidate changes; near a ceiling few do). Its true gain is w - l points of success.
Each trial runs Reef's sequential verdict (`reef.commit.gate.sequential_verdict`, the defaults:
confidence 0.8, three looks) on such draws, and the run counts how often the candidate is
selected, and how many tasks a verdict asked on average (it may stop early). A gain of 0 reads
the chance of selecting a candidate that is no better (at most 1 - confidence by design).
Seeded: a run prints the same table every time.

The gate with `halves` judges later candidates on half the task file, so its `n` is half the
file's. The races' gate has 92 tasks (46 a half), and the baseline column is its figure: each
row's power over the power at n = 92. Near the sentence task's ceiling (a race's last seven
verdicts) a line's candidate changed 4-5 answers of 46 (about 10%).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reef.commit.gate import look_parts, sequential_verdict  # noqa: E402
from reef.config import GateConfig  # noqa: E402

SIZES = (23, 46, 92, 184, 368)
BASELINE = 92
# (untied share, gain in points): near a ceiling (a tenth of the answers change) and early (a third)
CASES = ((0.10, 0.0), (0.10, 2.0), (0.10, 4.0), (0.10, 6.0), (0.30, 0.0), (0.30, 10.0))


def one_verdict(n: int, untied: float, gain: float, config: GateConfig, rng: random.Random) -> tuple[bool, int]:
    """Whether one simulated candidate is selected, and how many tasks its verdict asked."""
    w = (untied + gain / 100) / 2
    lose = untied - w
    before, after, asked = [], [], 0
    parts = look_parts(range(n), config.looks, str(rng.random()))
    for look, part in enumerate(parts, 1):
        for _ in part:
            draw = rng.random()
            before.append(0.0 if draw < w else 1.0 if draw < w + lose else 0.5)
            after.append(1.0 if draw < w else 0.0 if draw < w + lose else 0.5)
        asked += len(part)
        verdict = sequential_verdict(before, after, config, look, len(parts))
        if verdict is not None:
            return verdict.decision == "select", asked
    raise AssertionError("the last look always decides")  # pragma: no cover


def power(n: int, untied: float, gain: float, trials: int, seed: int = 0) -> dict[str, float]:
    """The share of `trials` simulated candidates selected on `n` tasks, and the tasks asked on average."""
    config = GateConfig()
    rng = random.Random(f"{seed}-{n}-{untied}-{gain}")
    outcomes = [one_verdict(n, untied, gain, config, rng) for _ in range(trials)]
    return {
        "n": n,
        "untied": untied,
        "gain": gain,
        "selected": sum(s for s, _ in outcomes) / trials,
        "tasks_asked": sum(a for _, a in outcomes) / trials,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=4000, help="simulated verdicts a row (default 4000)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "gate_size.json",
        help="where the rows go as JSON (default bench/results/gate_size.json)",
    )
    args = parser.parse_args()
    rows = [power(n, untied, gain, args.trials) for untied, gain in CASES for n in SIZES]
    base = {(r["untied"], r["gain"]): r["selected"] for r in rows if r["n"] == BASELINE}
    print(f"{'untied':>6} {'gain':>5} {'tasks':>5} {'selected':>8} {'x n=92':>7} {'asked':>6}")
    for r in rows:
        ratio = r["selected"] / base[(r["untied"], r["gain"])] if base[(r["untied"], r["gain"])] else float("nan")
        r["vs_baseline"] = ratio
        print(
            f"{r['untied']:>6.2f} {r['gain']:>5.1f} {r['n']:>5} {r['selected']:>8.3f} {ratio:>7.2f} "
            f"{r['tasks_asked']:>6.1f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"trials": args.trials, "baseline_n": BASELINE, "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
