"""Does the loop learn? `reef demo` on the embedded model, recorded.

Runs `reef.demo.run.run_demo` (its own `reef serve` with the learner and gate on, one-word
questions scored by a strict verifier) and writes the demo's figures to
bench/results/learning.json: held-out success (as the gate measured it, greedy) of the starting
release and of each published one, releases published and rejected, requests, and live traffic
success at the start and the end, and test success (questions nothing is trained or selected on)
of the starting and the final release, with the gains over the starting release (the baseline,
measured in the same run). The curve itself goes to bench/results/learning_curve.png.
Run on its own (not in CI), on an otherwise idle machine:

    .venv/bin/python bench/learning.py [--minutes 15] [--concurrency 8] [--out bench/results/learning.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from reef.demo.run import run_demo  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--model-dir", type=Path, default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "learning.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reef-bench-learning-") as work:
        out_dir = Path(work) / "out"
        result = run_demo(
            minutes=args.minutes,
            workdir=Path(work) / "demo",
            model_dir=args.model_dir,
            concurrency=args.concurrency,
            out_dir=out_dir,
        )
        curve = json.loads((out_dir / "learning_curve.json").read_text())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        (args.out.parent / "learning_curve.png").write_bytes((out_dir / "learning_curve.png").read_bytes())
    record = {
        "benchmark": "learning",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": {
            "minutes": args.minutes,
            "concurrency": args.concurrency,
            "model": str(args.model_dir or "SmolLM2-135M-Instruct"),
        },
        "result": {k: v for k, v in result.to_json().items() if k not in ("png", "json", "server_log")},
        "heldout": curve["heldout"],
        "rejected": curve["rejected"],
        "releases": curve["releases"],
        "test": curve["test"],
        "demo_settings": curve["settings"],
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(_against_baseline(result.start_heldout_success, result.final_heldout_success, "held-out (gate)"))
    print(_against_baseline(result.start_test_success, result.final_test_success, "test (never selected on)"))
    print(f"wrote {args.out}")


def _against_baseline(start: float | None, final: float | None, what: str) -> str:
    """The starting release is the baseline, measured in the same run."""
    if start is None or final is None:
        return f"{what}: not measured"
    ratio = f"{final / start:.2f}x the baseline" if start else "baseline 0"
    return f"{what}: {100 * start:.1f}% -> {100 * final:.1f}% ({100 * (final - start):+.1f} points, {ratio})"


if __name__ == "__main__":
    main()
