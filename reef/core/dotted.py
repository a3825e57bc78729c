"""Loading a Python object named by a dotted path, `package.module:attribute` (scorers, recipes)."""

from __future__ import annotations

import importlib
import re
from typing import Any

from reef.core.errors import InvalidInput

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}")


def load_dotted(path: str, what: str, shape: str = "package.module:name") -> Any:
    """The object `path` names; `InvalidInput` naming `what` (and the `shape` expected) when it
    cannot be found, in one line whatever went wrong: a path of another shape (no colon, a
    relative or file path), a module that is missing or fails as it is imported, a missing name."""
    if not isinstance(path, str) or not _DOTTED.fullmatch(path):
        raise InvalidInput(
            f"{what} {path!r} is not a dotted path ({shape}: Python names joined by dots, "
            "a colon, then the name in that module)"
        )
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"cannot load {what} {path!r} ({shape}): {_one_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - any error of the module's own code, said in one line
        raise InvalidInput(
            f"cannot load {what} {path!r}: importing {module_name} failed: {type(exc).__name__}: {_one_line(exc)}"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise InvalidInput(f"cannot load {what} {path!r} ({shape}): module {module_name!r} has no {attr!r}") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
