"""bench/race_ends.py ranks each arm's ends on its own, best first, from the race records on file."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import race_ends  # noqa: E402

RACES = Path(__file__).resolve().parent.parent / "bench" / "races"


def test_each_arms_ends_are_ranked_on_their_own() -> None:
    runs = [f"{RACES / 'sa2.json'}@{RACES / 'ds2.json'}", f"{RACES / 'sa7.json'}@{RACES / 'hs7.json'}"]
    ends = race_ends.ranked_ends(runs)
    assert [round(e, 1) for e in ends["bare"]] == [48.4, 17.6]  # seed 7's bare loop first
    assert [round(e, 1) for e in ends["reef"]] == [93.4, 11.0]
    assert set(ends) == {"bare", "reef", "line"}
