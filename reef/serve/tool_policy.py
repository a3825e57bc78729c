"""Client tools Reef cannot serve: left out with a warning, or refused (`unsupported_tools`).

Reef's runtimes call function tools only. An agent often sends more: tools only a provider runs
(`web_search`, `file_search`, `code_interpreter`, ...) or a type this server does not know.
With `unsupported_tools: drop` (the default) such a tool is left out of the request, the record
keeps its type under `dropped_tools`, and the answer carries an `x-reef-warning` header; with
`refuse` the request is a 400 naming the tool. A Responses `namespace` tool is not among them:
its functions are served as function tools (`reef/serve/responses_wire.py`).
"""

from __future__ import annotations

from typing import Literal

from reef.core.errors import InvalidInput

UnsupportedTools = Literal["drop", "refuse"]
WARNING_HEADER = "x-reef-warning"


class ToolPolicy:
    """What one request's parse does with the tools it cannot serve; `dropped` lists them."""

    def __init__(self, mode: UnsupportedTools = "drop") -> None:
        self.mode = mode
        self.dropped: list[str] = []

    def unsupported(self, kind: object, path: str) -> None:
        """Leave out (or refuse) the tool at `path`, of type `kind`."""
        if self.mode == "refuse":
            raise InvalidInput(
                f"{path}.type: {kind!r} tools are not supported; Reef serves function tools only "
                "(unsupported_tools: drop leaves them out instead)"
            )
        self.dropped.append(str(kind))


def warning(dropped: list[str] | tuple[str, ...]) -> str:
    """The `x-reef-warning` value for a request whose tools were left out."""
    kinds = ", ".join(dict.fromkeys(dropped))
    return f"tools left out, Reef cannot serve them: {kinds} (unsupported_tools: refuse refuses them)"
