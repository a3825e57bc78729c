"""Loading a Python object named by a dotted path, `package.module:attribute` (scorers, recipes)."""

from __future__ import annotations

import importlib
from typing import Any

from reef.core.errors import InvalidInput


def load_dotted(path: str, what: str, shape: str = "package.module:name") -> Any:
    """The object `path` names; `InvalidInput` naming `what` (and the `shape` expected) when it
    cannot be found."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise InvalidInput(f"{what} {path!r} is not a dotted path ({shape})")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidInput(f"cannot load {what} {path!r} ({shape}): {exc}") from None
