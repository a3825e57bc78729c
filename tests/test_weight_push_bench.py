"""bench/weight_push.py in its smallest form (the tiny test model, the embedded runtime, one repeat),
so the benchmark does not rot: both kinds of weights are pushed and timed, LoRA's ratio is 1."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.filterwarnings("ignore:Adapter .* was active which is now deleted:UserWarning")  # each repeat unloads it
def test_the_weight_push_bench_runs(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("weight_push", ROOT / "bench" / "weight_push.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    sys.modules["weight_push"] = bench
    spec.loader.exec_module(bench)
    out = tmp_path / "push.json"
    rows = bench.main(["--model", str(tiny_model_dir), "--runtimes", "embedded", "--repeats", "1", "--out", str(out)])
    assert [(r["runtime"], r["weights"]) for r in rows] == [("embedded", "lora"), ("embedded", "full")]
    assert all(len(r["seconds"]) == 1 and r["median_s"] > 0 for r in rows)
    assert rows[0]["vs_lora"] == 1.0 and rows[1]["bytes"] > rows[0]["bytes"]
    assert out.read_text().count('"weights"') == 2
