"""Would an average of the line's last candidates answer the test better than its newest one?

Reads the candidates a race's learner wrote (`bench/learning_race.py --line --workdir W`: every
candidate's adapter in W/line, named by the second it was made) and, at each snapshot minute
of `--minutes`, measures on the race's test questions, greedily, through the race's own
evaluation: the newest candidate (the race's `line` arm; `--check` measures it again) and the
uniform average of the newest `k` candidates of its line, for each `k` of `--average`. A line
begins again from the head when the learner drops it; the candidates of the line are followed
back through their parents (the candidate before, or the release the line began from again,
whichever is nearer in weight space), so an average never mixes two lines. Nothing here
trains or selects on the test questions; this measures a choice before Reef makes it.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/line_average.py --run NAME=RACE.json@WORKDIR ...
        [--average 4,8] [--minutes 10,11,12,13,14,15] [--check] [--out bench/results/line_average.json]

Prints, per run and overall, the mean success over the minutes measured for each variant and
the paired difference from the newest candidate; writes the figures as JSON. Not in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import torch  # noqa: E402

import bare_loop  # noqa: E402
from learning_race import _release_weights, evaluate, race_task  # noqa: E402


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return sum(float((a[k].float() - b[k].float()).pow(2).sum()) for k in a) ** 0.5


def mean_of(weights: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([w[k].float() for w in weights]).mean(0) for k in weights[0]}


def parents(line: list[dict[str, torch.Tensor]], releases: list[dict[str, torch.Tensor]]) -> list[int | None]:
    """Each candidate's parent in `line` (its index), or None where its line began (from the base
    or from a release), judged by which is nearer: the candidate before or a release."""
    out: list[int | None] = [None]
    for i in range(1, len(line)):
        before = distance(line[i], line[i - 1])
        nearest_release = min((distance(line[i], r) for r in releases), default=float("inf"))
        out.append(i - 1 if before <= nearest_release else None)
    return out


def newest_of_line(i: int, parent: list[int | None], k: int) -> list[int]:
    """Candidate `i` and its ancestors in its own line, newest first, at most `k`."""
    chain = [i]
    while len(chain) < k and parent[chain[-1]] is not None:
        chain.append(parent[chain[-1]])  # type: ignore[arg-type]
    return chain


def measure_run(name: str, race_path: Path, workdir: Path, ks: list[int], minutes: set[int], check: bool,
                model: Any, tokenizer: Any) -> dict[str, Any]:
    from safetensors.torch import load_file

    race = json.loads(race_path.read_text())
    task = race_task(race["settings"]["task"])
    made = sorted((float(p.stem), p) for p in (workdir / "line").glob("*.safetensors"))
    line = [load_file(p) for _, p in made]
    zero = {k: torch.zeros_like(v) for k, v in line[0].items()}
    state_releases = {s["release_id"] for s in race["arms"]["reef"]["snapshots"]} - {None}
    releases = [w for w in _release_weights(workdir / "state", state_releases).values() if w is not None] + [zero]
    parent = parents(line, releases)
    log(f"{name}: {len(line)} candidates, {sum(p is None for p in parent)} lines")
    rows = []
    for reef_snap, line_snap in zip(race["arms"]["reef"]["snapshots"], race["arms"]["line"]["snapshots"]):
        newest = [i for i, (second, _) in enumerate(made) if second <= reef_snap["wall"]]
        if round(reef_snap["minute"]) not in minutes or not newest:
            continue
        i = newest[-1]
        row = {"minute": reef_snap["minute"], "recorded": line_snap["success"],
               "newest": evaluate(model, tokenizer, line[i], task) if check else line_snap["success"]}
        for k in ks:
            chain = newest_of_line(i, parent, k)
            row[f"mean{k}"] = evaluate(model, tokenizer, mean_of([line[j] for j in chain]), task)
            row[f"mean{k}_of"] = len(chain)
        rows.append(row)
        log(f"{name} min {row['minute']:.0f}: " + ", ".join(f"{key} {100 * v:.1f}" for key, v in row.items()
                                                          if key not in ("minute",) and not key.endswith("_of")))
    return {"run": name, "task": task.name, "rows": rows}


def summary(runs: list[dict[str, Any]], ks: list[int]) -> str:
    lines = []
    variants = ["newest"] + [f"mean{k}" for k in ks]
    pooled: dict[str, list[float]] = {v: [] for v in variants}
    for run in runs:
        means = {v: sum(r[v] for r in run["rows"]) / len(run["rows"]) for v in variants}
        for v in variants:
            pooled[v] += [r[v] - r["newest"] for r in run["rows"]]
        lines.append(f"{run['run']:>6} ({run['task']}): " + ", ".join(f"{v} {100 * m:.1f}" for v, m in means.items()))
    for v in variants[1:]:
        diffs = pooled[v]
        mean = sum(diffs) / len(diffs)
        sd = (sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1)) ** 0.5
        better = sum(d > 0 for d in diffs)
        worse = sum(d < 0 for d in diffs)
        lines.append(f"{v} - newest: {100 * mean:+.2f} points over {len(diffs)} minutes (sd {100 * sd:.1f}; "
                     f"higher in {better}, lower in {worse})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=RACE.json@WORKDIR",
                        help="a race's record and the workdir it ran in (with --line)")
    parser.add_argument("--average", default="4,8", help="the k of each average, comma-separated")
    parser.add_argument("--minutes", default="10,11,12,13,14,15", help="the snapshot minutes measured, comma-separated")
    parser.add_argument("--check", action="store_true",
                        help="also measure the newest candidate again (the race's `line` arm records it)")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "line_average.json")
    args = parser.parse_args()
    ks = [int(k) for k in args.average.split(",")]
    tokenizer, model = bare_loop.load_model()
    runs = []
    for spec in args.run:
        name, rest = spec.split("=", 1)
        race, workdir = rest.split("@", 1)
        runs.append(measure_run(name, Path(race), Path(workdir), ks, {int(m) for m in args.minutes.split(",")},
                                args.check, model, tokenizer))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"benchmark": "line_average", "averages": ks, "runs": runs}, indent=2) + "\n")
    print(summary(runs, ks))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
