"""Draw Reef's arm of several learning-race runs on one plot, against the bare loop's marks.

    .venv/bin/python bench/race_overlay.py --task sentence --bare-30 6 --bare-final 86.8 \\
        --out docs/learning_race_sentence_gate_yields.png "starved (sa)=sa.json" "seed 1 (sa2)=sa2.json"

Each run is `label=path` to a JSON file bench/learning_race.py wrote. The bare loop is drawn as
two marks given on the command line (the minute it reached +30 points and its test success at
the end), so runs of Reef's arm alone (`--arms reef`) can be compared with a bare arm measured
in an earlier run on the same machine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GAINS = (10, 20, 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="label=path of a bench/learning_race.py JSON file")
    parser.add_argument("--task", required=True)
    parser.add_argument("--bare-30", type=float, required=True, help="minute the bare loop reached +30 points")
    parser.add_argument("--bare-final", type=float, required=True, help="the bare loop's test success at the end (%%)")
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
        snaps = record["arms"]["reef"]["snapshots"]
        ax.plot([s["second"] / 60 for s in snaps], [100 * s["success"] for s in snaps], marker="o", ms=3, label=label)
    for gain in (0, *GAINS):
        ax.axhline(100 * base + gain, color="grey", lw=0.6, ls="-" if gain == 0 else ":")
        ax.annotate(f"+{gain}" if gain else "base", (1.0, 100 * base + gain), xycoords=("axes fraction", "data"),
                    xytext=(3, -3), textcoords="offset points", fontsize=8, color="grey")
    ax.axvline(args.bare_30, color="black", lw=0.8, ls="--", label=f"bare loop reaches +30 ({args.bare_30:g} min)")
    ax.axvline(1.5 * args.bare_30, color="red", lw=0.8, ls="--", label=f"target: 1.5x that ({1.5 * args.bare_30:g} min)")
    ax.axhline(args.bare_final, color="black", lw=0.8, ls="-.", label=f"bare loop at the end ({args.bare_final:g}%)")
    ax.set(xlabel="minutes of wall clock", ylabel="test success, greedy (%)", ylim=(0, 100),
           title=f"task {args.task}: Reef's arm, several runs, against the bare loop's marks")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
