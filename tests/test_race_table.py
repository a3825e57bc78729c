"""bench/race_table.py on the race records the docs quote (bench/races/): the rows and the reading
they print are the figures docs/learning.md gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RACES = ROOT / "bench" / "races"


def table(tmp_path: Path, *runs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "race_table.py"), *runs, "--json", str(tmp_path / "t.json")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_rows_and_reading_from_the_records(tmp_path: Path) -> None:
    done = table(tmp_path, str(RACES / "dd3.json"), f"seed4={RACES / 'ds4.json'}", str(RACES / "dd4.json"))
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "t.json").read_text())
    rows = {r["label"]: r for r in out["rows"]}
    assert rows["dd3"]["ratio"] == 1.0 and rows["dd3"]["time_met"] and not rows["dd3"]["end_met"]
    assert round(100 * rows["dd3"]["end_gap"], 1) == -4.4
    assert rows["seed4"]["task"] == "sentence" and rows["seed4"]["end_met"] and round(rows["seed4"]["ratio"], 2) == 1.4
    assert rows["dd4"]["ratio"] == 2.0 and not rows["dd4"]["time_met"]
    reading = out["readings"]
    assert (reading["all"]["runs"], reading["all"]["time_met"], reading["all"]["end_met"]) == (3, 2, 1)
    assert (reading["demo"]["end_gap_points"]["below"], reading["sentence"]["end_gap_points"]["above"]) == (2, 1)
    assert "| dd3 | demo, 3 |" in done.stdout


def test_a_bare_loop_of_another_seed_is_refused(tmp_path: Path) -> None:
    done = table(tmp_path, f"{RACES / 'dd3.json'}@{RACES / 'dd4.json'}")
    assert done.returncode != 0 and "another task or seed" in done.stderr


def test_the_bare_loop_against_itself_is_the_noise_floor(tmp_path: Path) -> None:
    done = table(tmp_path, str(RACES / "dd3.json"), str(RACES / "dd4.json"), f"{RACES / 'ld4.json'}@{RACES / 'dd4.json'}",
                 str(RACES / "ds4.json"))
    assert done.returncode == 0, done.stderr
    readings = json.loads((tmp_path / "t.json").read_text())["readings"]
    floor = readings["demo"]["bare_against_bare"]
    assert (floor["ordered_pairs"], floor["no_lower"]) == (2, 1)  # seeds 3 and 4, seed 4's bare loop counted once
    assert (floor["bare_end"]["runs"], floor["reef_end"]["runs"]) == (2, 3)
    assert round(floor["bare_end"]["mean"], 2) == round((93.4066 + 87.9121) / 2, 2)
    assert readings["all"]["bare_against_bare"]["ordered_pairs"] == 2  # never a demo seed against a sentence seed
    assert "no lower in 1 of 2 ordered pairs" in done.stdout


def test_runs_of_one_seed_count_once_in_the_reading_by_seed(tmp_path: Path) -> None:
    done = table(tmp_path, str(RACES / "ds3.json"), f"{RACES / 'ls3.json'}@{RACES / 'ds3.json'}", str(RACES / "ds4.json"))
    assert done.returncode == 0, done.stderr
    rows = {r["label"]: r for r in json.loads((tmp_path / "t.json").read_text())["rows"]}
    seeds = json.loads((tmp_path / "t.json").read_text())["readings"]["all"]["by_seed"]
    seed3 = 100 * (rows["ds3"]["end_gap"] + rows["ls3"]["end_gap"]) / 2
    seed4 = 100 * rows["ds4"]["end_gap"]
    assert seeds["seeds"] == 2 and abs(seeds["mean"] - (seed3 + seed4) / 2) < 1e-9
    assert abs(seeds["standard_error"] - abs(seed3 - seed4) / 2) < 1e-9  # two values: stdev |a - b| / sqrt 2, over sqrt 2
    assert abs(seeds["lower_95"] - (seeds["mean"] - 6.3138 * seeds["standard_error"])) < 1e-3  # t, 1 degree of freedom
    assert "Each seed once (its Reef runs averaged)" in done.stdout


def test_a_run_where_neither_arm_reached_the_gain_is_not_counted_for_the_time(tmp_path: Path) -> None:
    done = table(tmp_path, str(RACES / "hs6.json"), str(RACES / "ds4.json"))
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "t.json").read_text())
    rows = {r["label"]: r for r in out["rows"]}
    assert rows["hs6"]["reach"] == {"bare": None, "reef": None, "line": None} and rows["hs6"]["time_met"] is None
    assert rows["hs6"]["end_met"]  # the gate kept the base while both loops fell to 0%
    reading = out["readings"]["all"]
    assert (reading["time_met"], reading["time_unreached"]) == (1, 1)
    assert "| neither | met |" in done.stdout and "in 1 of 1 (median ratio 1.40x), neither arm reached it in 1 more" in done.stdout


def test_the_t_quantile_matches_the_printed_tables() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from race_table import t_quantile

    for df, printed in ((2, 2.920), (6, 1.943), (10, 1.812), (30, 1.697)):
        assert abs(t_quantile(0.95, df) - printed) < 1e-3
    assert abs(t_quantile(0.975, 4) - 2.776) < 1e-3


def test_the_kinds_each_arm_held_at_the_end(tmp_path: Path) -> None:
    done = table(tmp_path, str(RACES / "ds2.json"), str(RACES / "hs8.json"))
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "t.json").read_text())
    rows = {r["label"]: r for r in out["rows"]}
    assert rows["ds2"]["kinds_held"]["bare"] == ["language"]  # the bare loop of seed 2 lost the others by 15
    assert rows["hs8"]["kinds_held"]["reef"] == ["capital", "opposite", "plural"]  # never the languages
    kinds = out["readings"]["all"]["kinds"]
    assert (kinds["bare"], kinds["reef"], kinds["bare_only"], kinds["reef_only"]) == (5, 7, 1, 3)
    assert "Kinds of question held at 15 (50% or more), over 2 runs: bare 5, Reef 7" in done.stdout


def test_the_line_against_the_bare_loop_per_optimiser_step(tmp_path: Path) -> None:
    done = table(tmp_path, str(RACES / "hs12.json"), str(RACES / "hs11.json"))
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "t.json").read_text())
    hs12 = {r["label"]: r for r in out["rows"]}["hs12"]["per_step"]
    # the bare loop took 184 steps by minute 15 (94.5% then); the line's candidates, 2 steps each,
    # were 89 at minute 12 (178 steps, 74.7%) and 97 at minute 13 (194 steps, past 184)
    assert hs12["steps"] == 184 and round(100 * hs12["bare"], 1) == 94.5 and round(100 * hs12["line"], 1) == 74.7
    assert round(hs12["bare_steps_per_minute"], 2) == round(184 / 15, 2)
    steps = out["readings"]["all"]["per_step"]
    assert steps["runs"] == 2 and (steps["above"], steps["below"]) == (1, 1)  # hs11's bare loop never learned the form
    assert "Per optimiser step, over 2 runs with the line" in done.stdout


def test_the_ends_ranked_compare_the_arms_without_pairing_seeds(tmp_path: Path) -> None:
    done = table(tmp_path, str(RACES / "ds3.json"), f"{RACES / 'ls3.json'}@{RACES / 'ds3.json'}", str(RACES / "ds4.json"),
                 str(RACES / "hs5.json"))
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "t.json").read_text())
    final = {r["label"]: {arm: 100 * v for arm, v in r["final"].items()} for r in out["rows"]}
    ranks = out["readings"]["all"]["by_rank"]
    seed3_reef = (final["ds3"]["reef"] + final["ls3"]["reef"]) / 2  # seed 3's two Reef runs, once
    assert ranks["ends"]["bare"] == sorted([final["ds3"]["bare"], final["ds4"]["bare"], final["hs5"]["bare"]], reverse=True)
    assert ranks["ends"]["reef"] == sorted([seed3_reef, final["ds4"]["reef"], final["hs5"]["reef"]], reverse=True)
    # the best bare loop (seed 5) is read against the best Reef run (seed 4), not against its own seed's
    reef = ranks["minus_bare"]["reef"]
    assert abs(reef["better_half"] - (final["ds4"]["reef"] - final["hs5"]["bare"])) < 1e-9
    assert abs(reef["worse_half"] - (final["hs5"]["reef"] - final["ds4"]["bare"])) < 1e-9
    seed3_line = (final["ds3"]["line"] + final["ls3"]["line"]) / 2
    assert ranks["ends"]["line"] == sorted([seed3_line, final["ds4"]["line"], final["hs5"]["line"]], reverse=True)
    assert "over the better 1 seeds" in done.stdout


def test_arms_that_never_learned_or_fell_back(tmp_path: Path) -> None:
    """hs6: neither arm left the base; hs11: the bare loop never did, Reef did; ds2: the bare loop
    fell 28.6 points from its best; as12 (Reef alone, read against hs12's bare loop): its line fell
    from 29.7% to 3.3% and learned again. The bare loop of seed 12 is counted once."""
    done = table(tmp_path, str(RACES / "hs6.json"), str(RACES / "hs11.json"), str(RACES / "ds2.json"),
                 str(RACES / "hs12.json"), f"{RACES / 'as12.json'}@{RACES / 'hs12.json'}")
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "t.json").read_text())
    rows = {r["label"]: r for r in out["rows"]}
    assert rows["hs6"]["falls"]["bare"]["stuck"] and rows["hs6"]["falls"]["line"]["stuck"]
    assert rows["hs11"]["falls"]["bare"]["stuck"] and not rows["hs11"]["falls"]["reef"]["stuck"]
    assert round(rows["ds2"]["falls"]["bare"]["deepest_fall"], 1) == 28.6
    assert rows["as12"]["falls"]["line"]["deepest_fall"] >= 20 and not rows["as12"]["falls"]["line"]["stuck"]
    falls = out["readings"]["all"]["falls"]
    assert (falls["bare"]["of"], falls["bare"]["stuck"], falls["bare"]["fell"]) == (4, 2, 1)
    assert (falls["line"]["of"], falls["line"]["stuck"], falls["line"]["fell"]) == (5, 1, 1)
    assert rows["hs6"]["falls"]["bare"]["first_gain_minute"] is None and rows["ds2"]["falls"]["bare"]["first_gain_minute"] == 4.0
    # first +10: the bare loop never on hs6 and hs11, at 4 and 3 on ds2 and hs12; the line never on hs6, else at 3-4
    assert (falls["bare"]["stalled"], falls["bare"]["first_gain_minute_median"]) == (2, None)
    assert (falls["line"]["stalled"], falls["line"]["first_gain_minute_median"]) == (1, 4.0)
    assert "stalled at the base's answers" in done.stdout


def test_a_run_too_short_to_tell_is_not_counted_as_stalled(tmp_path: Path) -> None:
    """hq5 ran 6 minutes and its line first stood +10 over the base at minute 6: not stalled.
    Cut at minute 5, it had not learned yet, and 5 minutes cannot tell a stall (minute 8) apart."""
    race = json.loads((RACES / "hq5.json").read_text())
    for arm in race["arms"].values():
        arm["snapshots"] = arm["snapshots"][:6]  # minutes 0-5
    (tmp_path / "cut.json").write_text(json.dumps(race))
    done = table(tmp_path, f"full={RACES / 'hq5.json'}@{RACES / 'hs5.json'}", f"cut={tmp_path / 'cut.json'}@{RACES / 'hs5.json'}")
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "t.json").read_text())
    rows = {r["label"]: r for r in out["rows"]}
    assert rows["full"]["falls"]["line"]["stalled"] is False and rows["cut"]["falls"]["line"]["stalled"] is None
    line = out["readings"]["all"]["falls"]["line"]
    assert (line["stalled"], line["stall_told"]) == (0, 1)
    assert "Ended under +10 over the base" in done.stdout
