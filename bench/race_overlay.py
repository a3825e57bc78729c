"""Draw the arms of several learning-race runs on one plot, against the bare loop.

    .venv/bin/python bench/race_overlay.py --task demo --out docs/learning_race_demo_look_order.png \\
        "bare, seed 0=bare0.json" "Reef, seed 0 (do1)=do1.json"
    .venv/bin/python bench/race_overlay.py --task sentence --bare-30 6 --bare-final 86.8 \\
        --out docs/learning_race_sentence_gate_yields.png "starved (sa)=sa.json" "seed 1 (sa2)=sa2.json"

Each run is `label=path` to a JSON file bench/learning_race.py wrote; every arm in it is drawn
(a bare loop's dashed, the line of a `--line` run dotted). A bare loop measured in an earlier run that left no curve can be drawn
as two marks instead (`--bare-30`, the minute it reached +30 points, and `--bare-final`, its test
success at the end), so runs of Reef's arm alone (`--arms reef`) can be compared with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GAINS = (10, 20, 30)
LINE_STYLE = {"bare": "--", "line": ":"}  # the bare loop dashed, the line Reef trains (`--line`) dotted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="label=path of a bench/learning_race.py JSON file")
    parser.add_argument("--task", required=True)
    parser.add_argument("--bare-30", type=float, help="minute the bare loop reached +30 points (a mark)")
    parser.add_argument("--bare-final", type=float, help="the bare loop's test success at the end (%%, a mark)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    base = 0.0
    for spec in args.runs:
        label, _, path = spec.partition("=")
        record = json.loads(Path(path).read_text())
        base = record["summary"]["base"]
        for arm, result in record["arms"].items():
            snaps = result["snapshots"]
            name = label if len(record["arms"]) == 1 else f"{label} ({arm})"
            ax.plot([s["second"] / 60 for s in snaps], [100 * s["success"] for s in snaps], marker="o", ms=3,
                    ls=LINE_STYLE.get(arm, "-"), label=name)
    for gain in (0, *GAINS):
        ax.axhline(100 * base + gain, color="grey", lw=0.6, ls="-" if gain == 0 else ":")
        ax.annotate(f"+{gain}" if gain else "base", (1.0, 100 * base + gain), xycoords=("axes fraction", "data"),
                    xytext=(3, -3), textcoords="offset points", fontsize=8, color="grey")
    if args.bare_30 is not None:
        ax.axvline(args.bare_30, color="black", lw=0.8, ls="--", label=f"bare loop reaches +30 ({args.bare_30:g} min)")
        ax.axvline(1.5 * args.bare_30, color="red", lw=0.8, ls="--", label=f"target: 1.5x that ({1.5 * args.bare_30:g} min)")
    if args.bare_final is not None:
        ax.axhline(args.bare_final, color="black", lw=0.8, ls="-.", label=f"bare loop at the end ({args.bare_final:g}%)")
    ax.set(xlabel="minutes of wall clock", ylabel="test success, greedy (%)", ylim=(0, 100),
           title=f"task {args.task}: the learning race, several runs")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
