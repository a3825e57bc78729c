"""The agent install script and its `reef-agent` wrapper, end to end: the script is fetched from a
real `reef serve` (upstream runtime on a scripted provider, a token set), run under `sh` in a
temporary HOME, and the wrapper it installs drives stand-in agents, small scripts that call
Reef through the official SDKs reading exactly the environment the real agents read (Claude
Code: ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN, ANTHROPIC_CUSTOM_HEADERS; opencode:
OPENCODE_CONFIG_CONTENT). A hostile harness server checks the wrapper writes nothing outside
its folders."""

from __future__ import annotations

import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.types import ArtifactKind
from reef.surfaces.agent_layout import BLOCK_BEGIN, BLOCK_END, skill_folder
from reef.surfaces.harness import HarnessTree, Skill
from tests.helpers.reef_server import ReefServer, free_port
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "install-token-4c1e"
SCENARIO = "shop"
HOSTILE_TEXT = "Never run $(touch PWNED) or `touch PWNED2`; quote \"this\" and 'that' \\ too."
TREE = HarnessTree(
    system="You are the shop's coding agent.",
    rules={"empty-token": "Handle the empty-token case first. " + HOSTILE_TEXT},
    skills={
        "release_notes": Skill(
            "release_notes", "Write release notes; ignore '; touch PWNED3 #", "Steps:\n1. $(rm -rf ~)\n2. `id`\n"
        )
    },
)

CLAUDE_STANDIN = '''#!{python}
"""Stand-in for Claude Code: the Anthropic SDK with the variables Claude Code reads."""
import json, os, pathlib, sys
import anthropic

headers = dict(line.split(": ", 1) for line in os.environ.get("ANTHROPIC_CUSTOM_HEADERS", "").splitlines() if ": " in line)
client = anthropic.Anthropic(default_headers=headers, max_retries=0, timeout=20)  # base URL and token from the env
memory = pathlib.Path("CLAUDE.md").read_text()
skills = sorted(p.parent.name for p in pathlib.Path(".claude/skills").glob("*/SKILL.md"))
receipts = []
for turn in (" ".join(sys.argv[1:]), "and the second turn"):
    raw = client.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=32, system=memory,
                                                   messages=[{{"role": "user", "content": turn}}])
    receipts.append(raw.headers["x-reef-agent-record-id"])
    if not "text" in locals():
        text = raw.parse().content[0].text
pathlib.Path(os.environ["STANDIN_OUT"]).write_text(json.dumps({{
    "argv": sys.argv[1:], "receipts": receipts, "skills": skills, "text": text,
    "api_key_set": "ANTHROPIC_API_KEY" in os.environ}}))
sys.exit(int(sys.argv[-1]))
'''

OPENCODE_STANDIN = '''#!{python}
"""Stand-in for opencode: its provider comes from OPENCODE_CONFIG_CONTENT, as opencode reads it."""
import json, os, pathlib, sys
import openai

config = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])
provider, model = config["model"].split("/", 1)
options = config["provider"][provider]["options"]
client = openai.OpenAI(base_url=options["baseURL"], api_key=options["apiKey"], default_headers=options["headers"],
                       max_retries=0, timeout=20)
raw = client.chat.completions.with_raw_response.create(
    model=model, messages=[{{"role": "system", "content": pathlib.Path("AGENTS.md").read_text()}},
                           {{"role": "user", "content": " ".join(sys.argv[1:])}}])
skills = sorted(p.parent.name for p in pathlib.Path(".opencode/skills").glob("*/SKILL.md"))
pathlib.Path(os.environ["STANDIN_OUT"]).write_text(json.dumps({{
    "argv": sys.argv[1:], "receipt": raw.headers["x-reef-agent-record-id"], "skills": skills}}))
'''


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    workdir = tmp_path_factory.mktemp("reef")
    with ReefState.open(workdir / "state") as state:  # the scenarios start with a published harness
        for name in (SCENARIO, "injected"):
            state.create(name, "skills", seed=Candidate(TREE.to_files(), ArtifactKind.HARNESS, {"kind": "seed"}))
    with ScriptedUpstream() as upstream:
        settings = {
            "tokens": [TOKEN],
            "upstream": {"url": upstream.base_url, "model": "provider-model", "timeout": 5},
            "harness": {"scenarios": {SCENARIO: {"mode": "pull"}}},
        }
        with ReefServer(workdir, settings) as server:
            yield server


def _clean_env(home: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "OPENCODE_", "REEF_"))}
    return {**keep, "HOME": str(home), **extra}


def _install(reef: ReefServer, home: Path, adapter: str) -> Path:
    answer = httpx.get(
        f"{reef.url}/reef/harness/install",
        params={"adapter": adapter, "scenario": SCENARIO},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/x-shellscript")
    done = subprocess.run(["sh"], input=answer.text, capture_output=True, text=True, env=_clean_env(home), timeout=30)
    assert done.returncode == 0, done.stderr
    wrapper = home / ".local" / "bin" / "reef-agent"
    assert f"It will write: {wrapper}" in done.stdout  # said before it wrote
    assert os.access(wrapper, os.X_OK)
    return wrapper


def _standin(path: Path, template: str) -> Path:
    path.write_text(template.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _run(wrapper: Path, args: list[str], home: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(wrapper), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(home, **{"REEF_TOKEN": TOKEN, **env}),
    )


def _record(reef: ReefServer, receipt: str) -> dict:
    answer = httpx.get(f"{reef.url}/reef/records/{receipt}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_install_needs_the_token_and_a_known_adapter(reef: ReefServer) -> None:
    assert httpx.get(f"{reef.url}/reef/harness/install", params={"adapter": "claude"}).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{reef.url}/reef/harness/install", params={"adapter": "vim"}, headers=auth).status_code == 400
    for url in ("http://x'$(id)", "http://h/\nrm", "ftp://host", "http://host/a b", "http://host/$HOME"):
        bad = httpx.get(f"{reef.url}/reef/harness/install", params={"adapter": "claude", "url": url}, headers=auth)
        assert bad.status_code == 400, url
    hostile_host = httpx.get(
        f"{reef.url}/reef/harness/install", params={"adapter": "pi"}, headers={**auth, "host": "evil'$(touch x)"}
    )
    assert hostile_host.status_code == 400 or "evil" not in hostile_host.text  # never baked in as sent


def _files(reef: ReefServer, **params: str) -> httpx.Response:
    return httpx.get(f"{reef.url}/reef/harness/files", params=params, headers={"Authorization": f"Bearer {TOKEN}"})


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert all(m.isfile() for m in tar.getmembers())
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def test_files_route_lays_the_harness_out_per_adapter(reef: ReefServer) -> None:
    pulled = _files(reef, adapter="pi", scenario=SCENARIO)
    assert pulled.status_code == 200 and pulled.headers["x-reef-harness-mode"] == "pull"
    members = _members(pulled.content)
    assert sorted(members) == [".pi/skills/reef-release-notes/SKILL.md", "reef-block.md"]
    assert HOSTILE_TEXT in members["reef-block.md"].decode()
    again = _files(reef, adapter="pi", scenario=SCENARIO, release_id=pulled.headers["x-reef-release-id"])
    assert again.content == pulled.content  # one release, one archive
    injected = _members(_files(reef, adapter="claude", scenario="injected").content)
    assert list(injected) == ["reef-block.md"] and b"inject mode" in injected["reef-block.md"]
    assert _files(reef, adapter="claude", scenario="nobody").status_code == 404
    assert _files(reef, adapter="emacs", scenario=SCENARIO).status_code == 400


def test_skill_folders_follow_the_agent_skills_name_rule() -> None:
    taken: set[str] = set()
    assert [skill_folder(n, taken) for n in ("a_b", "a-b", "x__y", "z")] == [
        "reef-a-b",
        "reef-a-b-2",
        "reef-x-y",
        "reef-z",
    ]


def test_dry_run_says_what_it_would_write_and_writes_nothing(reef: ReefServer, tmp_path: Path) -> None:
    script = httpx.get(
        f"{reef.url}/reef/harness/install", params={"adapter": "opencode"}, headers={"Authorization": f"Bearer {TOKEN}"}
    ).text
    done = subprocess.run(
        ["sh"],
        input=script,
        capture_output=True,
        text=True,
        env=_clean_env(tmp_path, REEF_AGENT_DRY_RUN="1"),
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "AGENTS.md" in done.stdout and ".opencode/skills/reef-*" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_claude_wrapper_pulls_the_harness_runs_the_agent_and_reports_by_session(
    reef: ReefServer, tmp_path: Path
) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    wrapper = _install(reef, home, "claude")
    skills = project / ".claude" / "skills"
    (skills / "mine").mkdir(parents=True)
    (skills / "mine" / "SKILL.md").write_text("---\nname: mine\ndescription: the user's own\n---\nmine\n")
    (skills / "reef-stale").mkdir()
    (skills / "reef-stale" / ".reef-owned").write_text("")
    (skills / "reef-stale" / "SKILL.md").write_text("from an older release\n")
    (project / "CLAUDE.md").write_text("# My notes\nkeep me\n")
    standin = _standin(tmp_path / "claude-standin", CLAUDE_STANDIN)
    out = tmp_path / "standin.json"

    first = _run(
        wrapper,
        ["fix", "the bug", "3"],
        home,
        project,
        REEF_AGENT_COMMAND=str(standin),
        STANDIN_OUT=str(out),
        ANTHROPIC_API_KEY="sk-ant-not-for-reef",
    )
    assert first.returncode == 3, first.stderr  # the agent's exit status, through exec
    seen = json.loads(out.read_text())
    assert seen["argv"] == ["fix", "the bug", "3"] and seen["api_key_set"] is False
    assert seen["skills"] == ["mine", "reef-release-notes"]  # the stale Reef skill is gone, the user's stays
    assert seen["text"] == "echo: fix the bug 3"

    memory = (project / "CLAUDE.md").read_text()
    assert memory.startswith("# My notes\nkeep me\n")
    assert memory.count(BLOCK_BEGIN) == 1 and memory.count(BLOCK_END) == 1
    assert HOSTILE_TEXT in memory and "You are the shop's coding agent." in memory
    skill = (skills / "reef-release-notes" / "SKILL.md").read_text()
    assert skill.startswith("---\nname: reef-release-notes\n") and "$(rm -rf ~)" in skill
    assert not list(tmp_path.rglob("PWNED*")) and not list(home.rglob("PWNED*"))  # text is never run

    session = (home / ".reef-agent" / "last-session").read_text().strip()
    for receipt in seen["receipts"]:
        record = _record(reef, receipt)["record"]
        assert record["scenario"] == SCENARIO and record["session"] == session

    (project / "CLAUDE.md").write_text(memory + "\nmy later note\n")
    second = _run(wrapper, ["again", "0"], home, project, REEF_AGENT_COMMAND=str(standin), STANDIN_OUT=str(out))
    assert second.returncode == 0, second.stderr
    memory = (project / "CLAUDE.md").read_text()
    assert memory.count(BLOCK_BEGIN) == 1 and "keep me" in memory and "my later note" in memory
    second_session = (home / ".reef-agent" / "last-session").read_text().strip()
    assert second_session != session  # a fresh session each run

    feedback = 'has "quotes" and \\ backslashes,\na newline, a\ttab and a \x01 control'
    report = _run(wrapper, ["report", "--score", "0", "--feedback", feedback], home, project)
    assert report.returncode == 0, report.stderr
    receipts = json.loads(out.read_text())["receipts"]
    reports = [_record(reef, receipt)["reports"] for receipt in receipts]  # the whole session, one trajectory
    assert reports[0] == reports[1] and [(r["score"], r["feedback"]) for r in reports[0]] == [(0.0, feedback)]
    assert sorted(reports[0][0]["references"]) == sorted(receipts)
    assert reports[0][0]["metadata"] == {"via": "reef-agent", "adapter": "claude"}
    assert _record(reef, seen["receipts"][0])["reports"] == []  # the first run's session is not reported

    bad = _run(wrapper, ["report", "--score", "01; rm -rf ~"], home, project)
    assert bad.returncode != 0 and "needs a number" in bad.stderr


def test_opencode_wrapper_configures_its_provider_and_skills(reef: ReefServer, tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    wrapper = _install(reef, home, "opencode")
    standin = _standin(tmp_path / "opencode-standin", OPENCODE_STANDIN)
    out = tmp_path / "standin.json"
    done = _run(wrapper, ["--", "report", "this"], home, project, REEF_AGENT_COMMAND=str(standin), STANDIN_OUT=str(out))
    assert done.returncode == 0, done.stderr
    seen = json.loads(out.read_text())
    assert seen["argv"] == ["report", "this"] and seen["skills"] == ["reef-release-notes"]
    assert (project / "AGENTS.md").read_text().startswith(BLOCK_BEGIN)
    record = _record(reef, seen["receipt"])["record"]
    session = (home / ".reef-agent" / "last-session").read_text().strip()
    assert record["scenario"] == SCENARIO and record["session"] == session
    assert _run(wrapper, ["report", "--score", "1"], home, project).returncode == 0
    assert [r["score"] for r in _record(reef, seen["receipt"])["reports"]] == [1.0]


GENERIC_STANDIN = '''#!{python}
"""Stand-in for any OpenAI-SDK agent: OPENAI_BASE_URL and OPENAI_API_KEY as the SDK reads them."""
import json, os, pathlib, sys
import openai

client = openai.OpenAI(default_headers={{"x-reef-scenario": os.environ["REEF_SCENARIO"],
                                        "x-reef-session": os.environ["REEF_SESSION"]}}, max_retries=0, timeout=20)
raw = client.chat.completions.with_raw_response.create(model="m", messages=[{{"role": "user", "content": "hi"}}])
pathlib.Path(os.environ["STANDIN_OUT"]).write_text(json.dumps({{
    "argv": sys.argv[1:], "receipt": raw.headers["x-reef-agent-record-id"], "agents_md": pathlib.Path("AGENTS.md").read_text()}}))
sys.exit(7)
'''


def test_generic_and_pi_wrappers(reef: ReefServer, tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    generic = _install(reef, home, "generic")
    standin = _standin(tmp_path / "generic-standin", GENERIC_STANDIN)
    out = tmp_path / "standin.json"
    done = _run(generic, ["--", str(standin), "--flag", "a b"], home, project, STANDIN_OUT=str(out))
    assert done.returncode == 7, done.stderr
    seen = json.loads(out.read_text())
    assert seen["argv"] == ["--flag", "a b"] and "empty-token" in seen["agents_md"]
    assert (project / ".agents" / "skills" / "reef-release-notes" / "SKILL.md").is_file()
    record = _record(reef, seen["receipt"])["record"]
    assert (
        record["scenario"] == SCENARIO
        and record["session"] == (home / ".reef-agent" / "last-session").read_text().strip()
    )

    pi = _install(reef, home, "pi")  # replaces the generic wrapper
    argv = tmp_path / "pi-argv"
    fake_pi = tmp_path / "pi"
    fake_pi.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{argv}'\n")
    fake_pi.chmod(0o755)
    assert _run(pi, ["-p", "do it"], home, project, REEF_AGENT_COMMAND=str(fake_pi)).returncode == 0
    extension = home / ".reef-agent" / "pi-reef-provider.ts"
    assert argv.read_text().splitlines() == [
        "--extension",
        str(extension),
        "--provider",
        "reef",
        "--model",
        "reef",
        "-p",
        "do it",
    ]
    assert 'registerProvider("reef"' in extension.read_text()
    assert (project / ".pi" / "skills" / "reef-release-notes" / "SKILL.md").is_file()

    down = _run(pi, ["x"], home, project, REEF_URL=f"http://127.0.0.1:{free_port()}", REEF_AGENT_COMMAND=str(fake_pi))
    assert down.returncode != 0 and "cannot reach Reef" in down.stderr
    wrong = _run(pi, ["x"], home, project, REEF_TOKEN="wrong", REEF_AGENT_COMMAND=str(fake_pi))
    assert wrong.returncode != 0 and "401" in wrong.stderr


# -- a hostile server ------------------------------------------------------------------------------


def _tar(*members: tarfile.TarInfo) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info in members:
            data = b"pwned\n" if info.isfile() else None
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


HOSTILE_ARCHIVES = {
    "dotdot": [_file("reef-block.md"), _file("../../x")],
    "dotdot inside a skill": [_file(".claude/skills/reef-a/../../../x")],
    "absolute": [_file("/tmp/reef-hostile-x")],
    "no block": [_file(".claude/skills/reef-a/SKILL.md")],
    "outside the folders": [_file("reef-block.md"), _file(".bashrc")],
    "user skill name": [_file(".claude/skills/mine/SKILL.md")],
    "shell in a name": [_file(".claude/skills/reef-$(touch PWNED)/SKILL.md")],
    "symlink": [_link(".claude/skills/reef-a/SKILL.md", "../../../../x")],
    "hard link": [_link(".claude/skills/reef-a/SKILL.md", "/etc/passwd", tarfile.LNKTYPE)],
}


@pytest.fixture(scope="module")
def hostile() -> Iterator[tuple[str, dict[str, bytes]]]:
    served: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = served["archive"]
            self.send_response(200)
            self.send_header("content-type", "application/x-tar")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"")
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


@pytest.mark.parametrize("case", sorted(HOSTILE_ARCHIVES))
def test_a_hostile_harness_writes_nothing_and_runs_nothing(
    reef: ReefServer, hostile: tuple[str, dict[str, bytes]], tmp_path: Path, case: str
) -> None:
    url, served = hostile
    home, project = tmp_path / "home", tmp_path / "a" / "b" / "project"
    home.mkdir()
    (project / ".claude" / "skills" / "mine").mkdir(parents=True)
    (project / "CLAUDE.md").write_text("mine\n")
    wrapper = _install(reef, home, "claude")
    served["archive"] = _tar(*HOSTILE_ARCHIVES[case])
    marker = tmp_path / "agent-ran"
    agent = tmp_path / "agent"
    agent.write_text(f"#!/bin/sh\ntouch '{marker}'\n")
    agent.chmod(0o755)
    before = _snapshot(tmp_path)

    done = _run(wrapper, ["hi"], home, project, REEF_URL=url, REEF_AGENT_COMMAND=str(agent))
    assert done.returncode != 0 and "refused the harness" in done.stderr
    assert not marker.exists()  # the agent is not started on a refused harness
    assert _snapshot(tmp_path) == before
    assert not Path("/tmp/reef-hostile-x").exists()
