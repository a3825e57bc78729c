"""Hardening 3, item 10's smaller defects: `reef export` never replaces or writes through a
symbolic link or a device; `reef-agent` never writes through a memory file or skills directory
that leads outside the project; a recipe named by a malformed dotted path is one clear line, and
a built-in recipe named by its dotted path gets its settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from click.testing import CliRunner, Result

from reef.cli import main
from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.types import ArtifactKind, Record, RecordStatus, Verdict
from reef.surfaces.harness import HarnessTree, Skill
from tests.helpers.reef_server import ROOT, ReefServer
from tests.scripted_upstream import ScriptedUpstream

SCENARIO = "exported"


def export(*args: str) -> Result:
    return CliRunner().invoke(main, ["export", *args], catch_exceptions=False)


def one_line_error(result: Result, words: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and words in result.output, result.output


# -- (b) reef export --out ---------------------------------------------------------------


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("export-links")
    with ReefState.open(root) as state:
        chain = state.create(SCENARIO, "skills")
        harness = HarnessTree(system="Be brief.").to_files()
        release = chain.publish(
            Candidate(harness, ArtifactKind.HARNESS), chain.head().release_id, verdict=Verdict("select")
        )
        state.store.put_record(
            Record(
                "one",
                SCENARIO,
                release.ref,
                {"messages": [{"role": "user", "content": "hi"}]},
                status=RecordStatus.COMPLETE,
                response={"text": "hello"},
            )
        )
    return {"root": str(root), "release": release.release_id}


def test_export_records_refuses_a_symlink_and_leaves_it_and_its_target_alone(
    state_dir: dict[str, Any], tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "out.jsonl"
    link.symlink_to(victim)
    stdout_like = tmp_path / "stdout"  # what /dev/stdout is: a link to the process's descriptor
    stdout_like.symlink_to("/proc/self/fd/1")
    for out in (link, stdout_like):
        result = export("records", SCENARIO, "--state-dir", state_dir["root"], "--out", str(out))
        one_line_error(result, "is a symbolic link")
        assert "'-' for standard output" in result.output
        assert out.is_symlink()
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "stdout", "victim.txt"]  # no leftovers


def test_export_records_refuses_a_pipe_or_device(state_dir: dict[str, Any], tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    one_line_error(
        export("records", SCENARIO, "--state-dir", state_dir["root"], "--out", str(fifo)), "is not a regular file"
    )
    assert fifo.is_fifo()  # (not /dev/null itself: code that failed this test would replace it)


def test_export_records_writes_a_regular_file_whole_and_never_follows_a_planted_temp_link(
    state_dir: dict[str, Any], tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / ".good.jsonl.tmp").symlink_to(victim)  # the temporary name an export used to open
    out = tmp_path / "good.jsonl"
    out.write_text("old\n")
    result = export("records", SCENARIO, "--state-dir", state_dir["root"], "--out", str(out))
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["metadata"]["record_id"] for line in out.read_text().splitlines()] == ["one"]
    assert victim.read_text() == "precious" and not out.is_symlink()
    stdout = export("records", SCENARIO, "--state-dir", state_dir["root"], "--out", "-")
    assert stdout.exit_code == 0 and json.loads(stdout.stdout.splitlines()[0])["metadata"]["record_id"] == "one"


def test_export_release_refuses_a_symlinked_directory(state_dir: dict[str, Any], tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "dest"
    link.symlink_to(elsewhere, target_is_directory=True)
    result = export("release", SCENARIO, state_dir["release"], str(link), "--state-dir", state_dir["root"])
    one_line_error(result, "is a symbolic link")
    assert link.is_symlink() and list(elsewhere.iterdir()) == []
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    one_line_error(
        export("release", SCENARIO, state_dir["release"], str(fifo), "--state-dir", state_dir["root"]),
        "is not a directory",
    )
    done = export("release", SCENARIO, state_dir["release"], str(tmp_path / "real"), "--state-dir", state_dir["root"])
    assert done.exit_code == 0 and (tmp_path / "real" / "harness" / "system.md").read_text() == "Be brief."


# -- (c) reef-agent never writes through a link leading outside the project ----------------


AGENT_SCENARIO = "agent-links"


@pytest.fixture(scope="module")
def agent_reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    workdir = tmp_path_factory.mktemp("agent-links")
    tree = HarnessTree(system="Work carefully.", skills={"notes": Skill("notes", "Write notes.", "Steps.\n")})
    with ReefState.open(workdir / "state") as state:
        state.create(AGENT_SCENARIO, "skills", seed=Candidate(tree.to_files(), ArtifactKind.HARNESS, {"kind": "seed"}))
    with ScriptedUpstream() as upstream:
        settings = {
            "upstream": {"url": upstream.base_url, "model": "p", "timeout": 5},
            "harness": {"scenarios": {AGENT_SCENARIO: {"mode": "pull"}}},
        }
        with ReefServer(workdir, settings) as server:
            yield server


def install_wrapper(reef: ReefServer, home: Path) -> Path:
    script = httpx.get(f"{reef.url}/reef/harness/install", params={"adapter": "claude", "scenario": AGENT_SCENARIO})
    assert script.status_code == 200, script.text
    done = subprocess.run(
        ["sh"],
        input=script.text,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
    )
    assert done.returncode == 0, done.stderr
    return home / ".local" / "bin" / "reef-agent"


def pull(wrapper: Path, home: Path, project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(wrapper), "pull"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "HOME": str(home)},
    )


def tree_of(root: Path) -> dict[str, str]:
    """Every entry under `root` (links as links): what it holds, or where it points."""
    return {
        str(p.relative_to(root)): (
            f"-> {os.readlink(p)}" if p.is_symlink() else p.read_text() if p.is_file() else "dir"
        )
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("linked", ["CLAUDE.md", ".claude", ".claude/skills", ".reef-agent"])
def test_reef_agent_refuses_a_link_that_leads_outside_the_project(
    agent_reef: ReefServer, tmp_path: Path, linked: str
) -> None:
    home, project, outside = tmp_path / "home", tmp_path / "project", tmp_path / "outside"
    for folder in (home, project, outside):
        folder.mkdir()
    wrapper = install_wrapper(agent_reef, home)
    if linked == "CLAUDE.md":
        (outside / "notes.md").write_text("someone else's file\n")
        (project / "CLAUDE.md").symlink_to(outside / "notes.md")
    else:
        (outside / "extensions").mkdir()  # what `rm -rf .reef-agent/extensions` would have removed
        (outside / "extensions" / "precious").write_text("kept\n")
        (outside / "skills" / "reef-old").mkdir(parents=True)
        (outside / "skills" / "reef-old" / ".reef-owned").write_text("")
        (project / linked).parent.mkdir(parents=True, exist_ok=True)
        (project / linked).symlink_to(outside, target_is_directory=True)
    before_outside, before_project = tree_of(outside), tree_of(project)

    done = pull(wrapper, home, project)
    assert done.returncode == 1, done.stderr
    assert (
        f"{linked} is a symbolic link to {outside.resolve()}" in done.stderr and "outside this project" in done.stderr
    )
    assert "nothing was written" in done.stderr and "Traceback" not in done.stderr
    assert tree_of(outside) == before_outside and tree_of(project) == before_project


def test_reef_agent_writes_through_a_link_that_stays_inside_the_project(agent_reef: ReefServer, tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    (project / "common" / "skills").mkdir(parents=True)
    (project / "AGENTS.md").write_text("# Ours\n")
    (project / "CLAUDE.md").symlink_to("AGENTS.md")  # a common setup: one memory file for every agent
    (project / ".claude").mkdir()
    (project / ".claude" / "skills").symlink_to("../common/skills", target_is_directory=True)
    wrapper = install_wrapper(agent_reef, home)

    done = pull(wrapper, home, project)
    assert done.returncode == 0, done.stderr
    assert (project / "CLAUDE.md").is_symlink()
    assert "Work carefully." in (project / "AGENTS.md").read_text()
    assert (project / "common" / "skills" / "reef-notes" / "SKILL.md").read_text().endswith("Steps.\n")


# -- (d) recipes named by a dotted path ----------------------------------------------------


def serve_refusal(tmp_path: Path, config: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`reef serve` on `config` (a recipe setting it refuses): a real process, to its exit."""
    path = tmp_path / "reef.yaml"
    path.write_text('upstream: {url: "http://127.0.0.1:9/v1", model: m}\n' + config)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (ROOT, pythonpath) if p), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "reef", "serve", "-c", str(path), "--state-dir", str(tmp_path / "state"), "--port", "9"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )


MALFORMED_RECIPES = {
    "no colon": ("reef.recipes.sao", "unknown recipe 'reef.recipes.sao'"),
    "relative": (".relative:Recipe", "is not a dotted path"),
    "a file path": ("reef/recipes/sao.py:SAORecipe", "is not a dotted path"),
    "missing module": ("no_such_package.recipes:Recipe", "No module named 'no_such_package'"),
    "missing attribute": ("reef.recipes.sao:NoSuchRecipe", "has no 'NoSuchRecipe'"),
    "not a class": ("reef.cli:main", "not a recipe class"),
    "not a recipe": ("reef.core.errors:InvalidInput", "is not a recipe: it lacks"),
    "module fails to import": (
        "half_written_recipe:Recipe",
        "importing half_written_recipe failed: RuntimeError: not finished",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_RECIPES))
def test_reef_serve_says_what_is_wrong_with_a_recipe_path_in_one_line(tmp_path: Path, case: str) -> None:
    path, words = MALFORMED_RECIPES[case]
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "half_written_recipe.py").write_text('raise RuntimeError("not finished")\n')
    for config in (f'recipes: {{default: "{path}"}}\n', f'recipes: {{scenarios: {{coding: "{path}"}}}}\n'):
        done = serve_refusal(tmp_path, config, modules)
        assert done.returncode == 1, (case, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert words in done.stderr, done.stderr
        assert not (tmp_path / "state").exists()  # refused before anything was created


def test_a_builtin_recipe_named_by_its_dotted_path_gets_its_settings(tmp_path: Path) -> None:
    from reef.config import load_config
    from reef.recipes.sao import SAORecipe

    config = tmp_path / "reef.yaml"
    config.write_text('recipes: {default: "reef.recipes.sao:SAORecipe"}\nlearner: {sao: {batch_size: 3, lr: 0.0005}}\n')
    learner = load_config(config).learner
    for binding in ("reef.recipes.sao:SAORecipe", "sao"):
        recipe = SAORecipe(learner.settings_for(binding))  # what the server builds the scenario's learner from
        assert (recipe.config.batch_size, recipe.train_config().lr) == (3, 0.0005), binding
    config.write_text('learner: {"reef.recipes.sao:SAORecipe": {batch_size: 5}}\n')
    assert load_config(config).learner.settings_for("sao").batch_size == 5  # and the other way round
    both = serve_refusal(tmp_path, 'learner: {sao: {batch_size: 3}, "reef.recipes.sao:SAORecipe": {batch_size: 5}}\n')
    assert both.returncode == 1 and "are both the settings of recipe 'sao'; keep one" in both.stderr, both.stderr
