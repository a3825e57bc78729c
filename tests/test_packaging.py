"""Packaging: the core install (`pip install reef-serve`, no extras) serves in front of a provider
without torch; missing extras and a missing `git` are named with the fix, not met as a traceback.

The slow test is the issue's "Show": a wheel of this tree, a fresh virtual environment, the wheel
installed alone at constraints.txt's versions, `import torch` failing there, and `reef serve` from
that environment answering a chat completion with a receipt that `reef report` scores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers.reef_server import ROOT, ReefServer
from tests.scripted_upstream import ScriptedUpstream

HEAVY = ("torch", "transformers", "peft", "safetensors", "gguf", "accelerate", "matplotlib", "rich")  # not in the core
NEVER_IMPORTED = HEAVY[:-1]  # httpx imports rich itself when it is there (for its own command line)


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without Reef's variables or an import path into this tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REEF_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **extra}


def test_the_upstream_only_server_never_imports_torch(upstream: ScriptedUpstream, tmp_path: Path) -> None:
    """In a fresh interpreter (which has torch here): build the app in front of a provider, answer
    a request with the learner on, and look at what got imported."""
    script = f"""
import sys
from fastapi.testclient import TestClient
import reef.cli
from reef.config import load_config
from reef.runtimes.factory import build_runtime
from reef.serve.app import create_app

config = load_config(None, env={{"REEF_UPSTREAM_URL": {upstream.base_url!r}, "REEF_STATE_DIR": {str(tmp_path)!r}}})
with TestClient(create_app(config, build_runtime(config)), base_url="http://127.0.0.1") as client:
    answer = client.post("/v1/chat/completions", json={{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}})
    assert answer.status_code == 200 and answer.headers["x-reef-agent-record-id"], answer.text
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({NEVER_IMPORTED!r}))
assert not heavy, f"serving upstream imported {{heavy}}"
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_missing_git_is_named_not_a_traceback(tmp_path: Path) -> None:
    from reef.commit.state import ReefState
    from reef.core.errors import StorageUnavailable

    no_git = tmp_path / "bin"
    no_git.mkdir()
    old = os.environ["PATH"]
    os.environ["PATH"] = str(no_git)
    try:
        with pytest.raises(StorageUnavailable, match=r"needs the `git` program .* install git"):
            ReefState.open(tmp_path / "state")
    finally:
        os.environ["PATH"] = old
    assert not (tmp_path / "state").exists(), "nothing is created without git"

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reef",
            "serve",
            "--upstream-url",
            "http://127.0.0.1:9/v1",
            "--state-dir",
            str(tmp_path / "served"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(PYTHONPATH=str(ROOT), PATH=str(no_git)),
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "Error: Reef needs the `git` program" in done.stderr


def test_no_document_installs_the_other_reef() -> None:
    """`reef` on the package index is an unrelated project: every install line names reef-serve."""
    wrong = []
    for path in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("reef/**/*.py"), ROOT / "Dockerfile"]:
        text = path.read_text()
        for needle in ("pip install reef ", "pip install 'reef[", 'pip install "reef[', "pip install reef["):
            if needle in text:
                wrong.append(f"{path.relative_to(ROOT)}: {needle}")
    assert not wrong


class VenvReefServer(ReefServer):
    """`reef serve` from another environment's `reef` command, importing nothing from this tree."""

    def __init__(self, command: Path, workdir: Path, settings: dict, env: dict[str, str]) -> None:
        super().__init__(workdir, settings, env)
        self.command = command

    def start(self) -> VenvReefServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / f"serve-{self.port}.yaml"
        config.write_text(yaml.safe_dump(self.settings))
        self.log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [str(self.command), "serve", "-c", str(config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.workdir,
        )
        self._wait_healthy()
        return self


def _run(*args: object, timeout: float = 120, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.mark.slow
def test_the_core_wheel_in_a_fresh_venv_serves_without_torch(upstream: ScriptedUpstream, tmp_path: Path) -> None:
    started = time.monotonic()
    src, dist, venv, work = tmp_path / "src", tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "reef", src / "reef", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", src, "-w", dist)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("reef_serve-*.whl")

    assert _run(sys.executable, "-m", "venv", venv).returncode == 0
    python, env = venv / "bin" / "python", _clean_env()
    installed = _run(
        python, "-m", "pip", "install", "--quiet", wheel, "-c", ROOT / "constraints.txt", env=env, timeout=240
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    probe = _run(
        python,
        "-c",
        f"import reef, importlib.util as u; print(reef.__file__); print([m for m in {HEAVY!r} if u.find_spec(m)])",
        cwd=tmp_path,
        env=env,
    )
    where, present = probe.stdout.splitlines()
    assert where.startswith(str(venv)) and present == "[]", probe.stdout + probe.stderr
    assert _run(python, "-c", "import torch", cwd=tmp_path, env=env).returncode != 0

    reef = venv / "bin" / "reef"
    no_runtime = _run(reef, "serve", "--state-dir", work / "none", cwd=tmp_path, env=env, timeout=60)
    assert no_runtime.returncode == 1 and "Traceback" not in no_runtime.stderr, no_runtime.stderr
    assert "pip install 'reef-serve[embedded]'" in no_runtime.stderr and "--upstream-url" in no_runtime.stderr
    demo = _run(reef, "demo", "--minutes", "0.1", "--workdir", work / "demo", cwd=tmp_path, env=env, timeout=60)
    assert demo.returncode == 1 and "pip install 'reef-serve[embedded,demo]'" in demo.stderr, demo.stderr

    upstream.script(text="Paris.")
    with VenvReefServer(reef, work, {"upstream": {"url": upstream.base_url, "model": "scripted"}}, env) as server:
        answer = httpx.post(
            f"{server.base_url}/chat/completions",
            timeout=30,
            json={"model": "any", "messages": [{"role": "user", "content": "Capital of France?"}]},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "Paris."
        receipt = answer.headers["x-reef-agent-record-id"]
        reported = _run(reef, "report", receipt, "--score", "1", "--url", server.url, cwd=tmp_path, env=env, timeout=60)
        assert reported.returncode == 0, reported.stderr
        assert _run(python, "-c", "import sys; print(sys.prefix)", env=env).stdout.strip() == str(venv)
        assert "Traceback" not in server.logs()
    assert time.monotonic() - started < 150, "packaging check took too long"
