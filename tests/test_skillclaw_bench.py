"""bench/skillclaw.py runs: one day of its task stream brings a night that adds a skill."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import skillclaw  # noqa: E402


def test_one_day_of_the_stream_brings_a_night_that_adds_a_skill(capsys: pytest.CaptureFixture[str]) -> None:
    assert skillclaw.main(["--days", "1", "--per-day", "8", "--noise", "0"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].startswith("  1  one_word") and "sc-single-word-only" in rows[1]
    assert skillclaw.score("paris", 7) == (1.0, None) and skillclaw.score("Paris", 7)[0] == 0.0
