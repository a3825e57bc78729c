"""After a race's last selection, does the gate see the line where the test does? After a race
run with `--line` and `--workdir`:

    .venv/bin/python bench/gate_gap.py WORKDIR RACE.json [WORKDIR RACE.json ...]

For each run: the minute of the last selection (the head that then served to the end) and, after
it, the line against that head two ways: on the gate's tasks, the mean over the later verdicts
of the candidate's success minus the head's (read from the run's commit log), and on the test,
the mean over the later snapshots of the line's newest candidate minus the head (from RACE.json).
A gate that judges a head on the tasks that chose it sees the line lower than the test does (the
winner's curse); docs/learning_race.md tabulates these figures. With `--timeline`, each run's verdicts
first, one line each (minute, decision, wins-losses-ties, success of candidate and head on the
tasks asked). Reads files only: no model, seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sample_lag import commit_entries  # noqa: E402


def verdicts(state_dir: Path, clock_start: float) -> list[tuple[float, str, dict[str, Any]]]:
    """Every verdict on the gate's tasks in the run's commit logs: (minute of the race, decision, metrics)."""
    found = [((entry.recorded_at - clock_start) / 60, entry.verdict.decision, dict(entry.verdict.metrics))
             for entry in commit_entries(state_dir)
             if entry.verdict is not None and "candidate_success" in entry.verdict.metrics]
    return sorted(found, key=lambda row: row[0])


def clock_start(race: dict[str, Any]) -> float:
    """The wall-clock second Reef's arm started, from its first snapshot."""
    first = race["arms"]["reef"]["snapshots"][0]
    return first["wall"] - first["second"]


def timeline(workdir: Path, race: dict[str, Any]) -> list[str]:
    """Every verdict of the run, one line each."""
    return [f"{minute:5.1f} {decision:7s} {m.get('wins')}-{m.get('losses')}-{m.get('ties')}  "
            f"candidate {100 * m['candidate_success']:.1f}%  head {100 * m['current_success']:.1f}%  "
            f"of {m.get('n')} tasks{_live(m)}"
            for minute, decision, m in verdicts(workdir / "state", clock_start(race))]


def _live(metrics: dict[str, Any]) -> str:
    """The live scores a verdict took in (`gate.live_split`), if any."""
    live = metrics.get("live")
    if not live:
        return ""
    return (f"  live mean score: line {live['line_mean']:.3f} of {live['line_n']}, head {live['serving_mean']:.3f} "
            f"of {live['serving_n']}, z {live['z']:.2f}; p tasks {metrics['p_tasks']:.3f}, both {metrics['p_value']:.3f}")


def gap(workdir: Path, race: dict[str, Any]) -> dict[str, Any]:
    head, line = race["arms"]["reef"]["snapshots"], race["arms"]["line"]["snapshots"]
    judged = verdicts(workdir / "state", clock_start(race))
    selected = [row for row in judged if row[1] == "select"]
    last = selected[-1][0] if selected else 0.0
    later = [metrics for minute, _, metrics in judged if minute > last]
    snapshots = [(h, ln) for h, ln in zip(head, line) if h["second"] / 60 > last]
    return {
        "last_selection_minute": last,
        "head_on_gate": selected[-1][2]["candidate_success"] if selected else None,
        "head_gate_tasks": selected[-1][2].get("n") if selected else None,  # the tasks its verdict asked
        "verdicts_after": len(later),
        "gate_line_minus_head": _mean_points([m["candidate_success"] - m["current_success"] for m in later]),
        "test_line_minus_head": _mean_points([ln["success"] - h["success"] for h, ln in snapshots]),
        "snapshots_after": len(snapshots),
        "published": len(selected), "rejected": len(judged) - len(selected),
        "selections_at": [round(row[0], 1) for row in selected],
    }


def _mean_points(values: list[float]) -> float | None:
    return 100 * sum(values) / len(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="WORKDIR RACE.json")
    parser.add_argument("--timeline", action="store_true", help="print each run's verdicts first, one line each")
    args = parser.parse_args()
    if len(args.runs) % 2:
        parser.error("give each run as a pair: WORKDIR RACE.json")
    for workdir, race_path in zip(args.runs[0::2], args.runs[1::2]):
        race = json.loads(Path(race_path).read_text())
        if "line" not in race["arms"]:
            parser.error(f"{race_path} is not a run with --line")
        if args.timeline:
            print("\n".join(timeline(Path(workdir), race)))
        result = gap(Path(workdir), race)
        print(json.dumps({"run": race_path, **result}))


if __name__ == "__main__":
    main()
