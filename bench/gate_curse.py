"""Is the head the gate chose better on the tasks that chose it than on others? After a race
run with `--gate-half --line`:

    HF_HUB_OFFLINE=1 .venv/bin/python bench/gate_curse.py WORKDIR RACE.json [--out RESULT.json]

That run's gate judged on one half of the held-out questions (`judged`); nothing asked, trained or
selected on the other half (`unjudged`; bench/race_gate_split.py). At each snapshot minute the
head that served and the line's newest candidate answer both halves, greedily, through the race's
evaluation. Every head but the base was selected on the judged half, so if one reused held-out
set makes the gate's choice look better than it is (the winner's curse), the line's lead over the
head is smaller on the judged half than on the unjudged one; without it the two leads differ only
by chance (two halves of 44-48 questions). Prints both leads, over the snapshots where a selected
head served and over those after the last selection, and writes them to RESULT.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bare_loop  # noqa: E402
from learning_race import _digest, _line_snapshots, _release_weights, evaluate_by_kind, race_task  # noqa: E402
from race_gate_split import HalfGate  # noqa: E402


def lead(rows: list[dict[str, Any]], half: str) -> float | None:
    """Mean over rows of the line's success minus the head's on one half, in points."""
    return 100 * sum(r[f"line_{half}"] - r[f"head_{half}"] for r in rows) / len(rows) if rows else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("race", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: RACE's name with _curse.json")
    args = parser.parse_args()
    record = json.loads(args.race.read_text())
    if not (record["settings"].get("gate_half") and record["settings"].get("line")):
        parser.error(f"{args.race} is not a run with --gate-half --line")
    task = race_task(record["settings"]["task"])
    halves = {"judged": HalfGate(task.module).heldout_tasks(), "unjudged": HalfGate(task.module).unjudged_tasks()}
    snapshots = record["arms"]["reef"]["snapshots"]
    tokenizer, model = bare_loop.load_model()
    base = bare_loop.adapter_weights(model)
    heads = _release_weights(args.workdir / "state", {s["release_id"] for s in snapshots} - {None})
    lines = _line_snapshots(args.workdir / "line", snapshots)
    seen: dict[tuple[str, str], float] = {}

    def success(weights: Any, half: str) -> float:
        key = (_digest(weights), half)
        if key not in seen:
            seen[key] = evaluate_by_kind(model, tokenizer, weights, task, halves[half])["all"]
        return seen[key]

    rows = []
    for snap, line in zip(snapshots, lines):
        head = heads.get(snap["release_id"]) or base
        row = {"minute": round(snap["second"] / 60, 3), "selected": heads.get(snap["release_id"]) is not None}
        for half in halves:
            row[f"head_{half}"], row[f"line_{half}"] = success(head, half), success(line["weights"] or base, half)
        rows.append(row)
        print(f"{row['minute']:5.1f}  head {100 * row['head_judged']:5.1f}% / {100 * row['head_unjudged']:5.1f}%  "
              f"line {100 * row['line_judged']:5.1f}% / {100 * row['line_unjudged']:5.1f}%  (judged / unjudged)", flush=True)
    final = snapshots[-1]["release_id"]
    last_selection = next(i for i, s in enumerate(snapshots) if s["release_id"] == final)
    spans = {"selected": [r for r in rows if r["selected"]], "after_last_selection": rows[last_selection:]}
    summary = {name: {"snapshots": len(span), "lead_judged": lead(span, "judged"), "lead_unjudged": lead(span, "unjudged")}
               for name, span in spans.items()}
    for name, s in summary.items():
        fmt = lambda v: "-" if v is None else f"{v:+.1f}"  # noqa: E731
        print(f"line's lead over the head, {name.replace('_', ' ')} ({s['snapshots']} snapshots): "
              f"judged half {fmt(s['lead_judged'])} points, unjudged half {fmt(s['lead_unjudged'])} points")
    out = args.out or args.race.with_name(args.race.stem + "_curse.json")
    out.write_text(json.dumps({"benchmark": "gate_curse", "race": str(args.race),
                               "questions": {h: len(q) for h, q in halves.items()}, "rows": rows,
                               "summary": summary}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
