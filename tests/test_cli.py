"""The `reef` command: documented, and honest about damaged state."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from reef.cli import main
from reef.commit.state import ReefState

DOCS = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def test_every_command_is_documented_and_answers_help() -> None:
    runner = CliRunner()
    documented = DOCS.read_text()
    for name in main.commands:
        assert f"`reef {name}" in documented, f"reef {name} is missing from docs/cli.md"
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output


def test_inspect_shows_heads_and_log_prints_steps(tmp_path: Path) -> None:
    with ReefState.open(tmp_path) as state:
        state.create("alpha", "sao")
    runner = CliRunner()
    shown = runner.invoke(main, ["inspect", "--state-dir", str(tmp_path), "--json"])
    assert shown.exit_code == 0, shown.output
    (row,) = json.loads(shown.output)
    assert row["scenario"] == "alpha" and row["step"] == 1 and row["recipe"] == "sao"
    logged = runner.invoke(main, ["log", "alpha", "--state-dir", str(tmp_path)])
    assert json.loads(logged.output.splitlines()[0])["operation"] == "creation"


def test_inspect_names_the_damaged_file_and_line(tmp_path: Path) -> None:
    with ReefState.open(tmp_path) as state:
        chain = state.create("alpha", "sao")
        chain.begin_batch("b1", [], [], high_water=0, expected_step=1)
        log_path = chain.log.path
    lines = log_path.read_bytes().split(b"\n")
    lines[0] = b"{broken" + lines[0]
    log_path.write_bytes(b"\n".join(lines))
    result = CliRunner().invoke(main, ["inspect", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{log_path}:1" in result.output


def test_inspect_refuses_a_missing_state_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", "--state-dir", str(tmp_path / "nope")])
    assert result.exit_code == 1 and "no state directory" in result.output


def test_serve_refuses_a_public_address_without_a_token(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("REEF_TOKEN", raising=False)
    result = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1 and "refusing to listen on 0.0.0.0 without a token" in result.output


def test_serve_refuses_a_bad_gate_setting_before_loading_a_model(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "Opposite of hot?", "answer": "cold"}) + "\n")
    config = tmp_path / "reef.yaml"
    config.write_text(
        f"learner:\n  gate:\n    tasks: {tasks}\n    scorer: reef.demo.tasks:gate_score\n    halves: true\n"
    )
    result = CliRunner().invoke(main, ["serve", "-c", str(config), "--state-dir", str(tmp_path / "state")])
    assert result.exit_code == 1 and "halves needs at least two tasks" in result.output, result.output
    assert not (tmp_path / "state").exists()  # refused before anything was created
    config.write_text(f"learner:\n  gate:\n    tasks: {tasks}\n    scorer: reef.demo.tasks:no_such_scorer\n")
    result = CliRunner().invoke(main, ["serve", "-c", str(config), "--state-dir", str(tmp_path / "state")])
    assert result.exit_code == 1 and "no_such_scorer" in result.output, result.output
