"""How reef's packages depend on each other: each imports only from lower layers (the order
`reef/__init__.py` states), so there are no cycles; and serving on an upstream provider never
imports torch (only the training process does)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import reef

ROOT = Path(reef.__file__).resolve().parent
LAYERS = [  # lowest first; a package may import its own modules and those of lower layers
    {"core"},
    {"config", "client", "extras"},
    {"observe", "runtimes", "ui"},
    {"surfaces"},
    {"commit"},
    {"grow"},
    {"recipes"},
    {"serve"},
    {"demo"},
    {"cli_state"},  # what the offline commands share
    {"cli_import", "cli_compact", "cli_export", "cli_train"},  # commands of their own modules, which cli registers
    {"cli"},
    {"__main__"},
]


def layer_of(package: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if package in names)


def imports(path: Path) -> set[str]:
    """The reef packages a module imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [node.module]
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else []
        )
        found.update(name.split(".")[1] for name in names if name.startswith("reef."))
    return found


def test_each_package_imports_only_lower_layers() -> None:
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        package = path.relative_to(ROOT).with_suffix("").parts[0]
        if package == "__init__":
            continue
        for other in imports(path) - {package}:
            if layer_of(other) >= layer_of(package):
                wrong.append(f"{path.relative_to(ROOT.parent)} imports reef.{other}")
    assert wrong == []


def test_every_package_has_a_layer() -> None:
    packages = {p.stem for p in ROOT.glob("*.py") if p.name != "__init__.py"} | {
        p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()
    }
    assert packages == set().union(*LAYERS)


UPSTREAM_SERVER = """
import asyncio, json, sys
from reef.config import load_config
from reef.runtimes.factory import build_runtime
from reef.serve.app import create_app

config = load_config(None, env={}, state_dir=sys.argv[1], upstream__url="http://127.0.0.1:9/v1", upstream__model="m",
                     recipes__scenarios={"harness": "skills", "weights": "sao"})
app = create_app(config, build_runtime(config))

async def main():
    async with app.router.lifespan_context(app):
        reef = app.state.reef
        await reef.scenarios.resolve("weights")  # bound to sao: its learner is set up, and idles
        await reef.scenarios.resolve("harness")
        return reef.learning.status()

status = asyncio.run(main())
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "peft", "safetensors"))
print(json.dumps({"heavy": heavy, "idle": status["idle"], "learners": [l["scenario"] for l in status["learners"]]}))
"""


def test_serving_upstream_never_imports_torch(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", UPSTREAM_SERVER, str(tmp_path / "state")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    idle = {row["scenario"]: row["reason"] for row in out["idle"]}
    assert "cannot load trained weights" in idle["weights"] and "harness" in out["learners"], out
