"""A newcomer's first minutes: `reef serve` warms the default scenario before it says it is ready,
then says where the dashboard is, a first request and how to score it, each of which works as
printed (run here as a shell would run it)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.helpers.reef_server import ReefServer

RECEIPT_PLACEHOLDER = "<x-reef-agent-record-id from its headers>"


def said(logs: str, prefix: str) -> str:
    """The rest of the one start line `reef: PREFIX...`."""
    found = [line[len(f"reef: {prefix}") :] for line in logs.splitlines() if line.startswith(f"reef: {prefix}")]
    assert len(found) == 1, logs
    return found[0]


def header(raw: str, name: str) -> str:
    values = [line.split(":", 1)[1].strip() for line in raw.splitlines() if line.lower().startswith(f"{name}:")]
    assert len(values) == 1, raw
    return values[0]


@pytest.mark.skipif(shutil.which("curl") is None, reason="the printed first request is a curl line")
def test_reef_serve_warms_up_and_its_first_steps_work_as_printed(tiny_model_dir: Path, tmp_path: Path) -> None:
    settings = {
        "embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": 4, "threads": 1, "warm_start": True}
    }
    with ReefServer(tmp_path, settings) as reef:
        logs = reef.logs()
        assert "warm start: the default scenario ready" in logs
        status = httpx.get(f"{reef.url}/reef/status").json()
        assert [learner["scenario"] for learner in status["learning"]["learners"]] == ["default"]
        assert status["storage"]["records"] == 0  # the warm-up token is never recorded

        dashboard = said(logs, "dashboard: ")
        assert dashboard == f"{reef.url}/ui"
        page = httpx.get(dashboard, follow_redirects=True)
        assert page.status_code == 200 and "<html" in page.text.lower()

        curl = said(logs, "first request: ")
        assert '"temperature": 0' in curl
        answered = subprocess.run(["sh", "-c", curl], capture_output=True, text=True, timeout=60, check=True)
        receipt = header(answered.stdout, "x-reef-agent-record-id")
        assert json.loads(answered.stdout.split("\n\n", 1)[1])["choices"][0]["message"]["role"] == "assistant"

        score = said(logs, "score it: ").split(" (or POST", 1)[0]
        assert RECEIPT_PLACEHOLDER in score
        command = score.replace(RECEIPT_PLACEHOLDER, shlex.quote(receipt))
        reported = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
        assert reported.returncode == 0, reported.stderr
        assert httpx.get(f"{reef.url}/reef/status").json()["storage"]["reports"] == 1
