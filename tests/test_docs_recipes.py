"""Every reason a built-in recipe gives for not learning from a record (a drop reason in the
learner status) or for closing a batch without a candidate (an abandon kind in the commit log)
is named in docs/learning.md. The reasons are read from the source, so a new one cannot slip in
undocumented."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [*sorted((ROOT / "reef" / "recipes").rglob("*.py")), ROOT / "reef" / "grow" / "rollouts.py"]
ABANDONS = {"Abandon", "ProposalFailed"}


def _text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def reasons_in(tree: ast.AST) -> set[str]:
    """`view.drop("x")`, `Abandon("x", ...)`, and the reasons a `*_problem`, `_ineligible` or
    `_refusal` function returns (a string, a tuple starting with one, or a `problem` it sets)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "drop" or name in ABANDONS:
                found.add(_text(node.args[0]) or "")
        if isinstance(node, ast.FunctionDef) and (
            node.name.endswith("problem") or node.name in ("_ineligible", "_refusal")
        ):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return):
                    value = inner.value.elts[0] if isinstance(inner.value, ast.Tuple) else inner.value
                    found.add(_text(value) or "")
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "problem" for t in node.targets):
            found.add(_text(node.value) or "")
    return found - {""}


def test_every_drop_reason_and_abandon_kind_is_documented() -> None:
    reasons = set().union(*(reasons_in(ast.parse(path.read_text())) for path in SOURCES))
    assert {"superseded", "already_used", "mixed_releases", "no_change", "stale"} <= reasons  # the reader sees them
    documented = set(re.findall(r"`([a-z_]+)`", (ROOT / "docs" / "learning.md").read_text()))
    missing = sorted(reasons - documented)
    assert not missing, f"reasons recipes give that docs/learning.md does not name: {missing}"
