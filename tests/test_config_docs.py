"""docs/configuration.md lists every setting, one line each, written from the settings' own
descriptions (as datasette checks its settings' documentation): the generated section must be
what the code generates now, and every setting must say what it does in one sentence."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from reef.config.catalog import BEGIN, END, generated_section, leaves, markdown, settings, write

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
MAX_DESCRIPTION = 200  # one line of the page, not a paragraph


def test_the_generated_section_of_configuration_md_is_current() -> None:
    assert generated_section(PAGE.read_text()) == markdown(), (
        "docs/configuration.md's settings differ from the code: run "
        "`python -m reef.config.catalog --write docs/configuration.md`"
    )


def test_every_setting_says_what_it_does_in_one_sentence() -> None:
    problems = []
    for setting in settings():
        text = setting.description
        if not text.strip():
            problems.append(f"{setting.name}: no description")
        elif re.search(r"[.!?]\s+[A-Z]", text) or text.endswith("."):
            problems.append(f"{setting.name}: more than one sentence, or a full stop (a line of the page)")
        elif len(text) > MAX_DESCRIPTION:
            problems.append(f"{setting.name}: {len(text)} characters (at most {MAX_DESCRIPTION})")
    assert not problems, "; ".join(problems)


def test_the_catalog_walks_every_section_and_each_declaration_once() -> None:
    keys = [leaf.name for leaf in leaves()]
    assert len(keys) == len(set(keys))
    assert {
        "port",
        "upstream.url",
        "learner.gate.margin",
        "learner.sao.lr",
        "learner.ttt_discover.lr",
        "learner.skills.gate.judge.url",
        "harness.scenarios.<name>.mode",
        "learner.openclaw_rl.hints.weight",
        "recipes.scenarios",
        "learner.canary",
    } <= set(keys)
    lines = {setting.name: setting.line() for setting in settings()}
    assert lines["learner.{sao,ttt_discover,openclaw_rl}.lr"].startswith(
        "- `learner.{sao,ttt_discover,openclaw_rl}.lr` (float, default `0.0005` (learner.openclaw_rl: `0.0001`)): "
    )
    assert "default `0.0` (learner.ttt_discover: `0.05`)" in lines["learner.{sao,ttt_discover,openclaw_rl}.kl_coef"]
    assert lines["learner.skills.llm.url"].startswith(
        "- `learner.skills.llm.url`, also under `learner.skills.gate.judge`, `learner.openclaw_rl.judge` and "
        "`learner.skillclaw.gate.judge` "
    )
    assert len(settings()) <= 150, "every setting earns its place (issue 61): at most 150"


def test_write_replaces_only_the_section_between_the_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nprose before\n\n{BEGIN}\n- `stale` (int, default `1`): gone\n{END}\n\nprose after\n")
    assert write(page) and not write(page)  # written once, then current
    text = page.read_text()
    assert text.startswith("# Title\n\nprose before\n\n") and text.endswith("\n\nprose after\n")
    assert "`stale`" not in text and generated_section(text) == markdown()
    done = subprocess.run(
        [sys.executable, "-m", "reef.config.catalog", "--write", str(page)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "already current" in done.stdout
