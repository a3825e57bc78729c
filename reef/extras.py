"""Optional parts of Reef and the extra that installs each, so a missing one is named with the
command that fixes it rather than met as an ImportError deep inside a traceback.

The core install (`pip install reef-serve`) serves in front of an upstream provider, records,
learns harnesses and keeps its state in SQLite; `embedded` adds the embedded model and weights
learning (torch, transformers, peft, ...), `demo` what `reef demo` draws with, `postgres` the
PostgreSQL store, `traces` OpenTelemetry.
"""

from __future__ import annotations

import importlib.util

from reef.core.errors import ReefError

DISTRIBUTION = "reef-serve"  # the name on the package index; `reef` there is another project
EXTRAS = {
    "embedded": ("torch", "transformers", "peft", "safetensors", "gguf"),
    "demo": ("matplotlib", "rich"),
    "postgres": ("psycopg",),
}


class MissingExtra(ReefError):
    """A part of Reef was asked for whose optional dependencies are not installed."""

    kind = "missing_extra_error"


def missing(*extras: str) -> list[str]:
    """The modules of these extras that cannot be imported here (found without importing them)."""
    return [m for extra in extras for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def install_hint(*extras: str) -> str:
    return f"pip install '{DISTRIBUTION}[{','.join(extras)}]'"


def require(what: str, *extras: str, otherwise: str = "") -> None:
    """Raise MissingExtra naming what needs them, the missing modules and the pip command that
    installs them (then `otherwise`, another way), unless every module is here."""
    absent = missing(*extras)
    if absent:
        raise MissingExtra(
            f"{what} needs {', '.join(absent)}, not installed here: {install_hint(*extras)}"
            + (f"; {otherwise}" if otherwise else "")
        )
