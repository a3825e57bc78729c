"""bench/gpu_check.py in its reduced form (`--cpu`: the tiny test model, a full-weight checkpoint
trained in Reef's training process, pushed into the embedded runtime under load and rolled back;
SGLang, not installed here, skipped saying so), so the GPU check does not rot."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_gpu_check_runs_on_the_cpu(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    assert spec and spec.loader
    check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = check
    spec.loader.exec_module(check)
    argv = ["--cpu", "--model", str(tiny_model_dir), "--engines", "embedded,sglang", "--weights", "full"]
    assert check.main([*argv, "--steps", "1", "--clients", "2"]) == 0
    out = capsys.readouterr().out
    assert "train full on cpu, 1 rank(s): 1 steps" in out
    assert "push full (1 rank) into embedded: sync" in out and "base's answer again: True" in out
    assert "embedded:" in out and " 0 failed" in out
    assert "sglang: not installed" in out  # no SGLang environment in a fresh --work
    assert out.rstrip().endswith("gpu check: OK")
