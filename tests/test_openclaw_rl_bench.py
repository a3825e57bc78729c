"""bench/openclaw_rl.py runs end to end in seconds on the tiny model (reduced: a few seconds of
scripted users), at the recipe's defaults, and writes its record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_bench_runs_at_the_recipes_defaults(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "openclaw_rl.json"
    command = [sys.executable, str(ROOT / "bench" / "openclaw_rl.py"), "--model-dir", str(tiny_model_dir)]
    command += ["--minutes", "0.1", "--settle-minutes", "0", "--concurrency", "2", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads(out.read_text())
    result = record["result"]
    assert result["test_questions"] == 91 and result["turns"] > 0 and "first_publication_minute" in result
    assert record["settings"]["turns_per_batch"] is None and not record["settings"]["own_judge"]  # the defaults
    assert "test success" in done.stdout
