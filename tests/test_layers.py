"""How reef's packages depend on each other: serving on an upstream provider never imports
torch (only the training process does)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

UPSTREAM_SERVER = """
import asyncio, json, sys
from reef.config import load_config
from reef.runtimes.factory import build_runtime
from reef.serve.app import create_app

config = load_config(None, env={}, state_dir=sys.argv[1], upstream__url="http://127.0.0.1:9/v1", upstream__model="m",
                     recipes__scenarios={"harness": "skills"})
app = create_app(config, build_runtime(config))

async def main():
    async with app.router.lifespan_context(app):
        reef = app.state.reef
        await reef.scenarios.resolve("weights")  # bound to sao: its learner is set up, and idles
        await reef.scenarios.resolve("harness")
        return reef.learning.status()

status = asyncio.run(main())
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "peft", "safetensors"))
print(json.dumps({"heavy": heavy, "idle": status["idle"]}))
"""


def test_serving_upstream_never_imports_torch(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", UPSTREAM_SERVER, str(tmp_path / "state")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    idle = {row["scenario"]: row["reason"] for row in out["idle"]}
    assert "cannot load trained weights" in idle["weights"] and "skills" in idle["harness"], idle
