"""The real Codex CLI through Reef, with its default flags (its `namespace` and `web_search` tools
included): Reef on the upstream runtime in front of a scripted provider, Codex configured by the
`codex` adapter's install script, `codex exec` through `reef-agent` doing one `exec_command`
round trip, then a report on the session; and plain `codex --profile reef`, whose own
`session-id` header names the session, calling one of its sub-agent (`namespace`) tools. Codex is installed once with npm into a cache folder
(~/.cache/reef/codex, or REEF_CODEX_PREFIX); the test is skipped, saying why, without node/npm
or when the install fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from reef.core.types import Record
from reef.observe.sqlite_store import SQLiteStore
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

CODEX_VERSION = "0.171.0"
PREFIX = Path(os.environ.get("REEF_CODEX_PREFIX", Path.home() / ".cache" / "reef" / "codex"))
SCENARIO = "coding"
MARKER = "reef-round-trip-7f3"


def codex_binary() -> Path:
    """Codex CLI at CODEX_VERSION in PREFIX, installed there on first use; skips saying why."""
    binary = PREFIX / "node_modules" / ".bin" / "codex"
    if binary.exists() and CODEX_VERSION in _version(binary):
        return binary
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("the Codex CLI test needs node and npm on the PATH")
    PREFIX.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["npm", "install", "--prefix", str(PREFIX), "--no-audit", "--no-fund", f"@openai/codex@{CODEX_VERSION}"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm install @openai/codex@{CODEX_VERSION} took over 10 minutes")
    if done.returncode != 0 or not binary.exists():
        pytest.skip(f"npm install @openai/codex@{CODEX_VERSION} failed: {done.stderr.strip()[-300:]}")
    return binary


def _version(binary: Path) -> str:
    try:
        return subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def provider(body: dict[str, Any]) -> str:
    """After the scripted tool call: the model's last word quotes the last line of its output."""
    outputs = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    return f"The command printed: {outputs[-1].strip().splitlines()[-1]}" if outputs else "nothing to do"


@pytest.fixture
def reef(tmp_path: Path) -> Iterator[tuple[ReefServer, ScriptedUpstream]]:
    with ScriptedUpstream() as upstream:
        upstream.answer_with(provider)
        settings = {"upstream": {"url": upstream.base_url, "model": "provider-model", "timeout": 20}}
        with ReefServer(tmp_path / "reef", settings) as server:
            yield server, upstream


def _env(home: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_", "REEF_"))}
    return {**keep, "HOME": str(home), "PATH": f"{PREFIX / 'node_modules' / '.bin'}:{keep['PATH']}", **extra}


def _install(reef: ReefServer, home: Path) -> Path:
    script = httpx.get(f"{reef.url}/reef/harness/install", params={"adapter": "codex", "scenario": SCENARIO})
    assert script.status_code == 200, script.text
    dry = subprocess.run(["sh", "-s", "--", "--dry-run"], input=script.text, capture_output=True, text=True,
                         env=_env(home), timeout=30)  # fmt: skip
    assert dry.returncode == 0 and "[model_providers.reef]" in dry.stdout and not (home / ".codex").exists()
    done = subprocess.run(["sh"], input=script.text, capture_output=True, text=True, env=_env(home), timeout=30)
    assert done.returncode == 0, done.stderr
    return home / ".local" / "bin" / "reef-agent"


def _session_records(reef: ReefServer, session: str) -> list[Record]:
    with SQLiteStore(reef.state_dir / "experience.db") as store:
        return store.session_records(SCENARIO, session)


def test_codex_exec_with_its_default_flags_does_a_tool_round_trip_through_reef(
    reef: tuple[ReefServer, ScriptedUpstream], tmp_path: Path
) -> None:
    server, upstream = reef
    binary = codex_binary()
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    wrapper = _install(server, home)
    config = (home / ".codex" / "config.toml").read_text()
    assert f'base_url = "{server.url}/v1"' in config and 'wire_api = "responses"' in config

    upstream.script(tool_calls=[{"name": "exec_command", "arguments": {"cmd": f"echo {MARKER}"}}])
    started = time.monotonic()
    done = subprocess.run(
        [str(wrapper), "exec", f"Run: echo {MARKER}"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(home, REEF_TOKEN="none"),
    )
    took = time.monotonic() - started
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{server.logs()[-3000:]}"
    assert f"The command printed: {MARKER}" in done.stdout, done.stdout
    assert str(binary).endswith("codex") and took < 60, took

    session = (home / ".reef-agent" / "last-session").read_text().strip()
    turns = _session_records(server, session)
    assert len(turns) >= 2, turns
    first, last = turns[0], turns[-1]
    assert first.response is not None and [c["name"] for c in first.response["tool_calls"]] == ["exec_command"]
    assert first.request["dropped_tools"] == ["web_search"]  # noted, while the namespace's functions are served
    assert "spawn_agent" in {t["name"] for t in first.request["tools"]}
    assert any(MARKER in m["content"] for m in last.request["messages"] if m["role"] == "tool")
    sent = upstream.requests[0].body
    assert "web_search" not in json.dumps(sent["tools"]) and sent["model"] == "provider-model"

    report = subprocess.run(
        [str(wrapper), "report", "--score", "1", "--feedback", "ran it"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(home, REEF_TOKEN="none"),
    )
    assert report.returncode == 0 and f"on session {session}" in report.stderr, report.stderr
    reported = httpx.get(f"{server.url}/reef/records/{last.id}").json()
    assert reported["reports"] and reported["reports"][0]["score"] == 1.0

    # plain codex, no wrapper: its own session id; a call of a namespace's function (a sub-agent
    # tool) reaches Codex's handler of that namespace, which answers for the unknown agent id
    upstream.script(tool_calls=[{"name": "wait_agent", "arguments": {"targets": ["nobody"], "timeout_ms": 10}}])
    direct = subprocess.run(
        [str(binary), "--profile", "reef", "exec", "Wait for the agent"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(home, REEF_TOKEN="none", REEF_SCENARIO=SCENARIO),
    )
    assert direct.returncode == 0 and "The command printed: invalid agent id nobody" in direct.stdout, direct.stderr
    codex_session = next(
        line.split(":", 1)[1].strip() for line in direct.stderr.splitlines() if line.startswith("session id:")
    )
    assert _session_records(server, codex_session), f"no record under Codex's session-id {codex_session}"
