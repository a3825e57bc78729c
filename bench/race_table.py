"""Several learning races against the issue's target, one row a run and the reading over all of them.

    .venv/bin/python bench/race_table.py bench/races/*.json [--json OUT.json]
    .venv/bin/python bench/race_table.py dd0=reef_only.json@bare0.json ...

Each argument is a JSON file bench/learning_race.py wrote (`label=` before it names the row;
the file's stem otherwise). A run of Reef's arm alone (`--arms reef`) is read against the bare
loop of another run of the same task and seed: `REEF.json@BARE.json`. Per run: the minute each
arm first stood +30 points over the base on the test, Reef's over the bare loop's, the test
success of each arm at the end and over minutes 10-15, Reef's scored samples and verdicts, and
whether the run met the target (Reef's +30 no later than 1.5x the bare loop's minute, "neither"
where neither arm reached it; Reef's end no lower than the bare loop's). Over the runs: how many
met each half, and Reef's end minus the bare loop's (mean, its standard error, and the sign test
over runs either way: one run's end moves a few points by chance, 91 test questions), the same
with each seed counted once and the most it allows Reef to end below (Student's t), the kinds of
question each arm learned (a kind flips whole), the same target read between bare loops of
different seeds (its noise floor), each arm's ends ranked (the two spreads compared without
pairing seeds, which share little), and, for runs with the line (`--line`), the line against the
bare loop per optimiser step: how much of Reef's end is its steps a minute and how much what a
step buys, and how often each arm ended under +10 over the base (never learned, or lost it), fell
20 points from its best, or stalled at the base's answers (first +10 at minute 8 or later, or
never). Reads files only: no model, seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from learning_race import summarise  # noqa: E402
from reef.core.sign_test import sign_test_p  # noqa: E402

TIME_RATIO = 1.5  # the target: Reef's +30 no later than this times the bare loop's minute
GAIN = 30
TIME_WORDS = {True: "met", False: "missed", None: "neither"}
HELD = 0.5  # a kind of question an arm answers this share of at minute 15 or more is one it learned
ONE_SIDED = 0.95
STUCK_GAIN = 10  # an arm under this many points over the base at minute 15 never learned, or fell back
FALL = 20  # points an arm lost from its best so far: a fall
STALL_MINUTES = 8  # an arm first STUCK_GAIN points over the base this late, or never, stalled at the base's answers
STEPS_PER_CANDIDATE = 2  # the demo's learner.sao.steps_per_candidate since 2026-12-01 (records before it lack the field)


def t_quantile(p: float, df: int) -> float:
    """The p point of Student's t with `df` degrees of freedom (p above 1/2), by bisection on its
    distribution function, the density integrated by Simpson's rule: the standard library has no t."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = lambda x: math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))  # noqa: E731

    def cdf(x: float, n: int = 2000) -> float:
        h = x / n
        odd = sum(density((2 * i - 1) * h) for i in range(1, n // 2 + 1))
        even = sum(density(2 * i * h) for i in range(1, n // 2))
        return 0.5 + h / 3 * (density(0.0) + 4 * odd + 2 * even + density(x))

    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, 2 * high
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return (low + high) / 2


def load(argument: str) -> dict[str, Any]:
    """One row's arms, from `[label=]RACE.json[@BARE.json]`."""
    label, _, paths = argument.rpartition("=")
    reef_path, _, bare_path = paths.partition("@")
    race = json.loads(Path(reef_path).read_text())
    arms = dict(race["arms"])
    if bare_path:
        bare_race = json.loads(Path(bare_path).read_text())
        if (bare_race["settings"]["task"], bare_race["settings"]["seed"]) != (race["settings"]["task"],
                                                                            race["settings"]["seed"]):
            raise SystemExit(f"{argument}: the bare loop is of another task or seed")
        arms["bare"] = bare_race["arms"]["bare"]
    if "bare" not in arms or "reef" not in arms:
        raise SystemExit(f"{argument}: needs both arms (a run of Reef's arm alone: REEF.json@BARE.json)")
    return {"label": label or Path(reef_path).stem, "task": race["settings"]["task"],
            "seed": race["settings"]["seed"], "base": race["summary"]["base"], "arms": arms,
            "steps_per_candidate": race["settings"].get("steps_per_candidate", STEPS_PER_CANDIDATE)}


def row(run: dict[str, Any]) -> dict[str, Any]:
    summary = summarise(run["arms"], run["base"])  # what bench/learning_race.py prints for one run
    reach = {name: gains[str(GAIN)] for name, gains in summary["minutes_to_gain"].items()}
    final, ratio = summary["final"], summary["ratio_reef_over_bare"][str(GAIN)]
    reef_arm = run["arms"]["reef"]
    return {"label": run["label"], "task": run["task"], "seed": run["seed"], "reach": reach, "ratio": ratio,
            "final": final, "late": summary["late_mean"], "end_gap": final["reef"] - final["bare"],
            "time_met": time_met(reach), "end_met": final["reef"] >= final["bare"] - 1e-9,
            "kinds_held": kinds_held(run["arms"]), "per_step": per_step(run), "falls": falls(run),
            "samples": reef_arm.get("reports"), "published": reef_arm.get("published"),
            "rejected": reef_arm.get("rejected"), "errors": reef_arm.get("errors")}


def time_met(reach: dict[str, float | None]) -> bool | None:
    """Reef's +30 no later than TIME_RATIO times the bare loop's minute; None where neither reached it."""
    if reach["reef"] is None:
        return None if reach["bare"] is None else False
    return reach["bare"] is None or reach["reef"] <= TIME_RATIO * reach["bare"] + 1e-9


def falls(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per arm: whether it ended under STUCK_GAIN points over the base (never learned the task, or
    lost it again), the most points it ever stood under its best so far (its deepest fall), and the
    minute it first stood STUCK_GAIN points over the base (None: never), how long it stayed at the
    base's answers."""
    out = {}
    for name, arm in run["arms"].items():
        curve = [100 * snap["success"] for snap in arm["snapshots"]]
        best = [max(curve[:i + 1]) for i in range(len(curve))]
        learned = [snap["minute"] for snap, c in zip(arm["snapshots"], curve) if c >= 100 * run["base"] + STUCK_GAIN - 1e-9]
        first = learned[0] if learned else None
        out[name] = {"stuck": curve[-1] < 100 * run["base"] + STUCK_GAIN - 1e-9,
                     "deepest_fall": max(b - c for b, c in zip(best, curve)),
                     "first_gain_minute": first,
                     # None: a run shorter than STALL_MINUTES that had not learned yet cannot tell
                     "stalled": (first >= STALL_MINUTES - 1e-9 if first is not None
                                 else None if arm["snapshots"][-1]["minute"] < STALL_MINUTES else True)}
    return out


def per_step(run: dict[str, Any]) -> dict[str, Any] | None:
    """The line and the bare loop at the same optimiser step: the most steps both took by the end,
    each arm's test success at its last snapshot at or before that step, and each arm's steps a
    minute (None: no line, or a record without the bare loop's steps)."""
    bare, line = run["arms"]["bare"], run["arms"].get("line")
    if line is None or "steps" not in bare or any("candidates" not in s for s in line["snapshots"]):
        return None
    bare_seconds = [step["second"] for step in bare["steps"]]
    bare_curve = [(sum(t <= snap["second"] for t in bare_seconds), snap["success"]) for snap in bare["snapshots"]]
    line_curve = [(run["steps_per_candidate"] * snap["candidates"], snap["success"]) for snap in line["snapshots"]]
    steps = min(bare_curve[-1][0], line_curve[-1][0])
    at = lambda curve: [success for taken, success in curve if taken <= steps][-1]  # noqa: E731
    minutes = bare["snapshots"][-1]["second"] / 60
    return {"steps": steps, "bare": at(bare_curve), "line": at(line_curve),
            "bare_steps_per_minute": bare_curve[-1][0] / minutes, "line_steps_per_minute": line_curve[-1][0] / minutes}


def per_step_reading(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Over the runs with a line, the line's test success minus the bare loop's at the same step
    (`per_step`): a line that learns as much a step as the bare loop is level here, and ahead at
    the end by its extra steps a minute."""
    steps = [r["per_step"] for r in rows if r["per_step"] is not None]
    if not steps:
        return None
    gaps = [100 * (s["line"] - s["bare"]) for s in steps]
    above, below = sum(g > 1e-6 for g in gaps), sum(g < -1e-6 for g in gaps)
    return {"runs": len(steps), "mean": statistics.fmean(gaps), "median": statistics.median(gaps),
            "standard_error": statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else None,
            "above": above, "below": below, "p_line_lower": sign_test_p(below, above),
            "steps_median": statistics.median(s["steps"] for s in steps),
            "bare_steps_per_minute": statistics.fmean(s["bare_steps_per_minute"] for s in steps),
            "line_steps_per_minute": statistics.fmean(s["line_steps_per_minute"] for s in steps)}


def kinds_held(arms: dict[str, Any]) -> dict[str, list[str]] | None:
    """The kinds of question each arm answers HELD or more of at the end (None: a record without kinds)."""
    ends = {name: arm["snapshots"][-1].get("by_kind") for name, arm in arms.items()}
    if any(by_kind is None for by_kind in ends.values()):
        return None
    return {name: sorted(kind for kind, v in by_kind.items() if kind != "all" and v >= HELD)
            for name, by_kind in ends.items()}


def kinds_reading(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each kind of each run counted once: held at the end by both arms, by one, or by neither. A
    kind flips whole (learned or not), so the end's spread is mostly which kinds a loop happened to
    learn; the sign test over the kinds only one arm held says whether Reef learns fewer. Over runs,
    not seeds: a bare loop that several Reef runs are read against counts once for each (a kind is
    held or not, so runs of one seed cannot be averaged the way `by_seed` averages the end)."""
    rows = [r for r in rows if r["kinds_held"] is not None]
    if not rows:
        return None
    kinds = [set(r["kinds_held"]["bare"]) | set(r["kinds_held"]["reef"]) for r in rows]
    bare_only = sum(len(set(r["kinds_held"]["bare"]) - set(r["kinds_held"]["reef"])) for r in rows)
    reef_only = sum(len(set(r["kinds_held"]["reef"]) - set(r["kinds_held"]["bare"])) for r in rows)
    return {"runs": len(rows), "bare": sum(len(r["kinds_held"]["bare"]) for r in rows),
            "reef": sum(len(r["kinds_held"]["reef"]) for r in rows), "either": sum(map(len, kinds)),
            "bare_only": bare_only, "reef_only": reef_only, "p_reef_fewer": sign_test_p(bare_only, reef_only)}


def spread(values: list[float]) -> dict[str, Any]:
    return {"runs": len(values), "mean": statistics.fmean(values) if values else None,
            "stdev": statistics.stdev(values) if len(values) > 1 else None}


def bare_against_bare(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The noise floor of the end target: the bare loop of one seed against that of another (the same task,
    the same test questions). A second loop no better than the first still ends no lower only in some pairs."""
    ends: dict[str, dict[int, float]] = {}
    for r in rows:
        ends.setdefault(r["task"], {})[r["seed"]] = 100 * r["final"]["bare"]
    pairs = [(a, b) for by_seed in ends.values() for i, a in by_seed.items() for j, b in by_seed.items() if i != j]
    bare_ends = [end for by_seed in ends.values() for end in by_seed.values()]
    return {"ordered_pairs": len(pairs), "no_lower": sum(a >= b - 1e-6 for a, b in pairs), "bare_end": spread(bare_ends),
            "reef_end": spread([100 * r["final"]["reef"] for r in rows])}


def falls_reading(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """How often each arm ended stuck under STUCK_GAIN points over the base, how often it fell
    FALL points or more from its best, and how often it stalled (first STUCK_GAIN over the base at
    STALL_MINUTES or later, or never) with the median of that first minute (never: past the end):
    the bare loop each seed once (runs of a seed share it), Reef and its line each run."""
    bare_by_seed = {(r["task"], r["seed"]): r["falls"]["bare"] for r in rows}
    arms = {"bare": list(bare_by_seed.values()), "reef": [r["falls"]["reef"] for r in rows],
            "line": [r["falls"]["line"] for r in rows if "line" in r["falls"]]}
    first = lambda f: math.inf if f.get("first_gain_minute") is None else f["first_gain_minute"]  # noqa: E731
    median = lambda runs: statistics.median(first(f) for f in runs)  # noqa: E731
    return {name: {"of": len(runs), "stuck": sum(f["stuck"] for f in runs),
                   "fell": sum(f["deepest_fall"] >= FALL - 1e-9 for f in runs),
                   "stalled": sum(f.get("stalled") is True for f in runs),
                   "stall_told": sum(f.get("stalled") is not None for f in runs),
                   "first_gain_minute_median": None if math.isinf(median(runs)) else median(runs)}
            for name, runs in arms.items() if runs}


def by_seed(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Reef's end minus the bare loop's with each seed counted once (its Reef runs averaged): runs of one
    seed share its bare loop, so they are not independent draws of the difference. `lower_95`: the mean
    less 1.645 standard errors (a normal approximation, optimistic for a few seeds), the most the runs
    allow Reef to end below the bare loop at 95% one-sided."""
    seeds: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        seeds.setdefault((r["task"], r["seed"]), []).append(100 * r["end_gap"])
    gaps = [statistics.fmean(g) for g in seeds.values()]
    se = statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else None
    mean = statistics.fmean(gaps)
    return {"seeds": len(gaps), "mean": mean, "standard_error": se,
            "lower_95": None if se is None else mean - t_quantile(ONE_SIDED, len(gaps) - 1) * se}


def ends_by_rank(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each arm's ends at 15, each seed once (its Reef runs averaged), best first, and Reef's (and its
    line's, where every run has one) minus the bare loop's rank by rank, over the better and the worse
    half of the seeds. Seeds pair the arms only loosely (neither shares the other's samples), so a
    difference picked by one arm's own end (the seeds where the bare loop learned) is partly that
    arm's luck; ranks compare the spreads without picking."""
    arms = ["bare", "reef"] + (["line"] if all("line" in r["final"] for r in rows) else [])
    seeds: dict[tuple[str, int], dict[str, list[float]]] = {}
    for r in rows:
        ends = seeds.setdefault((r["task"], r["seed"]), {arm: [] for arm in arms})
        for arm in arms:
            ends[arm] = [100 * r["final"][arm]] if arm == "bare" else ends[arm] + [100 * r["final"][arm]]
    if len(seeds) < 2:
        return None
    ranked = {arm: sorted((statistics.fmean(e[arm]) for e in seeds.values()), reverse=True) for arm in arms}
    half = len(seeds) // 2
    gap = lambda arm, part: statistics.fmean(a - b for a, b in zip(ranked[arm][part], ranked["bare"][part]))  # noqa: E731
    return {"seeds": len(seeds), "half": half, "ends": ranked,
            "minus_bare": {arm: {"better_half": gap(arm, slice(0, half)), "worse_half": gap(arm, slice(len(seeds) - half, None))}
                           for arm in arms[1:]}}


def reading(rows: list[dict[str, Any]]) -> dict[str, Any]:
    gaps = [100 * r["end_gap"] for r in rows]
    above, below = sum(g > 1e-6 for g in gaps), sum(g < -1e-6 for g in gaps)
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    return {"runs": len(rows), "time_met": sum(r["time_met"] is True for r in rows),
            "time_unreached": sum(r["time_met"] is None for r in rows),
            "ratio_median": statistics.median(ratios) if ratios else None,
            "end_met": sum(r["end_met"] for r in rows), "requests_failed": sum(r["errors"] or 0 for r in rows),
            "end_gap_points": {"mean": statistics.fmean(gaps), "median": statistics.median(gaps),
                               "standard_error": statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else None,
                               "above": above, "below": below, "level": len(gaps) - above - below,
                               "p_reef_lower": sign_test_p(below, above), "p_reef_higher": sign_test_p(above, below)},
            "by_seed": by_seed(rows), "kinds": kinds_reading(rows), "bare_against_bare": bare_against_bare(rows),
            "per_step": per_step_reading(rows), "by_rank": ends_by_rank(rows), "falls": falls_reading(rows)}


def readings(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The reading over every run, and over each task's runs where there are several tasks."""
    tasks = sorted({r["task"] for r in rows})
    out = {"all": reading(rows)}
    if len(tasks) > 1:
        out.update({task: reading([r for r in rows if r["task"] == task]) for task in tasks})
    return out


def reading_text(name: str, summary: dict[str, Any]) -> list[str]:
    gap = summary["end_gap_points"]
    se = "-" if gap["standard_error"] is None else f"{gap['standard_error']:.1f}"
    ratios = summary["ratio_median"]
    unreached = summary["time_unreached"]
    return [f"{name}: +{GAIN} within {TIME_RATIO}x of the bare loop's minute in {summary['time_met']} of "
            f"{summary['runs'] - unreached} (median ratio {'-' if ratios is None else f'{ratios:.2f}x'})"
            f"{f', neither arm reached it in {unreached} more' if unreached else ''}; end no lower than the "
            f"bare loop's in {summary['end_met']} of {summary['runs']}; requests failed: {summary['requests_failed']}",
            f"  Reef's end minus the bare loop's, points: mean {gap['mean']:+.1f} (standard error {se}), median "
            f"{gap['median']:+.1f}; above in {gap['above']}, below in {gap['below']}, level in {gap['level']} "
            f"(sign test over runs: p {gap['p_reef_lower']:.2f} that Reef ends lower, {gap['p_reef_higher']:.2f} higher)",
            *by_seed_text(summary["by_seed"]), *kinds_text(summary["kinds"]),
            *noise_floor_text(summary["bare_against_bare"]), *by_rank_text(summary["by_rank"]),
            *per_step_text(summary["per_step"]), *falls_text(summary["falls"])]


def by_seed_text(seeds: dict[str, Any]) -> list[str]:
    if seeds["standard_error"] is None:
        return []
    return [f"  Each seed once (its Reef runs averaged): mean {seeds['mean']:+.1f} (standard error "
            f"{seeds['standard_error']:.1f}, {seeds['seeds']} seeds); Reef ends no more than "
            f"{max(0.0, -seeds['lower_95']):.1f} points below the bare loop at 95% (one-sided, Student's t)"]


def kinds_text(kinds: dict[str, Any] | None) -> list[str]:
    if kinds is None:
        return []
    return [f"  Kinds of question held at 15 ({100 * HELD:.0f}% or more), over {kinds['runs']} runs: bare "
            f"{kinds['bare']}, Reef {kinds['reef']}; the bare loop alone held {kinds['bare_only']}, Reef alone "
            f"{kinds['reef_only']} (sign test: p {kinds['p_reef_fewer']:.2f} that Reef holds fewer)"]


def noise_floor_text(floor: dict[str, Any]) -> list[str]:
    if not floor["ordered_pairs"]:
        return []
    bare, reef = floor["bare_end"], floor["reef_end"]
    number = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    return [f"  The bare loop against itself (another seed, the same test questions): no lower in {floor['no_lower']} "
            f"of {floor['ordered_pairs']} ordered pairs. Ends at 15, points: bare mean {number(bare['mean'])} "
            f"(stdev {number(bare['stdev'])}, {bare['runs']} seeds), Reef mean {number(reef['mean'])} "
            f"(stdev {number(reef['stdev'])}, {reef['runs']} runs)"]


def by_rank_text(ranks: dict[str, Any] | None) -> list[str]:
    if ranks is None:
        return []
    ends = "; ".join(f"{arm} " + " ".join(f"{v:.1f}" for v in values) for arm, values in ranks["ends"].items())
    gaps = "; ".join(f"{arm} {g['better_half']:+.1f} over the better {ranks['half']} seeds, {g['worse_half']:+.1f} over "
                     f"the worse {ranks['half']}" for arm, g in ranks["minus_bare"].items())
    return [f"  Ends at 15 ranked, each seed once, best first: {ends}.", f"  Minus the bare loop rank by rank, points: {gaps}"]


def per_step_text(steps: dict[str, Any] | None) -> list[str]:
    if steps is None:
        return []
    se = "-" if steps["standard_error"] is None else f"{steps['standard_error']:.1f}"
    return [f"  Per optimiser step, over {steps['runs']} runs with the line: steps a minute bare "
            f"{steps['bare_steps_per_minute']:.1f}, line {steps['line_steps_per_minute']:.1f}; at the steps both took "
            f"(median {steps['steps_median']:.0f}) the line minus the bare loop, points: mean {steps['mean']:+.1f} "
            f"(standard error {se}), median {steps['median']:+.1f}; ahead in {steps['above']}, behind in "
            f"{steps['below']} (sign test: p {steps['p_line_lower']:.2f} that the line learns less a step)"]


def falls_text(falls: dict[str, dict[str, Any]]) -> list[str]:
    names = {"bare": "the bare loop", "reef": "Reef", "line": "Reef's line"}
    counts = lambda key: ", ".join(f"{names[arm]} {f[key]} of {f['of']}" for arm, f in falls.items())  # noqa: E731
    minute = lambda v: "never" if v is None else f"{v:.1f}"  # noqa: E731
    medians = ", ".join(f"{names[arm]} {minute(f['first_gain_minute_median'])}" for arm, f in falls.items())
    return [f"  Ended under +{STUCK_GAIN} over the base (never learned, or fell back), the bare loop each seed once: "
            f"{counts('stuck')}; fell {FALL} points or more from its best: {counts('fell')}",
            f"  First +{STUCK_GAIN} over the base, median minute: {medians}; stalled at the base's answers "
            f"(first +{STUCK_GAIN} at minute {STALL_MINUTES} or later, or never; a shorter run that had not "
            f"learned yet is not counted): " + ", ".join(f"{names[arm]} {f['stalled']} of {f['stall_told']}"
                                                         for arm, f in falls.items())]


def text(rows: list[dict[str, Any]], summaries: dict[str, dict[str, Any]]) -> str:
    pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
    mins = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    lines = ["| run | task, seed | bare +30 | Reef +30 (x bare) | line +30 | at 15: bare, Reef, line | "
             "minutes 10-15: bare, Reef | samples | pub/rej | time | end |",
             "|---|---|---:|---:|---:|---|---|---:|---:|---|---|"]
    for r in rows:
        ratio = f" ({r['ratio']:.2f}x)" if r["ratio"] is not None else ""
        end = "met" if r["end_met"] else f"{100 * r['end_gap']:+.1f}"
        line_final = pct(r["final"]["line"]) if "line" in r["final"] else "-"
        lines.append(
            f"| {r['label']} | {r['task']}, {r['seed']} | {mins(r['reach']['bare'])} | {mins(r['reach']['reef'])}{ratio} | "
            f"{mins(r['reach'].get('line'))} | {pct(r['final']['bare'])}, {pct(r['final']['reef'])}, {line_final} | "
            f"{pct(r['late']['bare'])}, {pct(r['late']['reef'])} | {r['samples']} | {r['published']}/{r['rejected']} | "
            f"{TIME_WORDS[r['time_met']]} | {end} |")
    lines.append("")
    for name, summary in summaries.items():
        lines += reading_text(name, summary)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="[LABEL=]RACE.json[@BARE.json]")
    parser.add_argument("--json", type=Path, help="also write the rows and the reading here")
    args = parser.parse_args()
    rows = [row(load(argument)) for argument in args.runs]
    summaries = readings(rows)
    print(text(rows, summaries))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "readings": summaries}, indent=2) + "\n")


if __name__ == "__main__":
    main()
