"""Each arm's end at the last minute over many seeds, ranked best first: a picture of
bench/race_table.py's ranked reading, for sets of runs of one task side by side.

    cd bench/races && ../../.venv/bin/python ../race_ends.py --out ../../docs/learning_race_sentence_ends.png \\
        "after_first: sa2.json@ds2.json sa3.json@ds3.json ..." "every task: ds2.json hs3.json@ds3.json ..."

Each set is `NAME: RUN RUN ...`, a run as race_table.py takes it (`RACE.json[@BARE.json]`). The bare
loop is drawn once (from the first set; every set should hold the same seeds), then each set's Reef
head (solid) and line (dotted, where every run has one). Ranks, not seeds, on the x axis: the
arms of one seed share little of their luck, so each arm's spread is compared rank for rank.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from race_table import ends_by_rank, load, row  # noqa: E402


def ranked_ends(runs: list[str]) -> dict[str, list[float]]:
    ranks = ends_by_rank([row(load(run)) for run in runs])
    if ranks is None:
        raise SystemExit("a set needs runs of two seeds or more")
    return ranks["ends"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="+", help="NAME: RACE.json[@BARE.json] ...")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--title", default="", help="the plot's title")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for index, spec in enumerate(args.sets):
        name, _, runs = spec.partition(":")
        ends = ranked_ends(runs.split())
        ranks = range(1, len(ends["bare"]) + 1)
        if index == 0:
            ax.plot(ranks, ends["bare"], "k--o", label="bare loop", markersize=4)
        head = ax.plot(ranks, ends["reef"], "-o", label=f"Reef's head, {name.strip()}", markersize=4)[0]
        if "line" in ends:
            ax.plot(ranks, ends["line"], ":", color=head.get_color(), label=f"its line, {name.strip()}")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # ranks, never 1.2
    ax.set_xlabel("seed's rank by its end (each arm ranked on its own, best first)")
    ax.set_ylabel("test success at the end, greedy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(args.title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
