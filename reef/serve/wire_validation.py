"""Validation errors that name the field: `messages[2].content: ...` in both dialects."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from reef.core.errors import InvalidInput


def field_path(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def validate_wire(model: type[BaseModel], data: Any, path: str) -> Any:
    """`model.model_validate(data)`, with the first problem raised as `InvalidInput` naming its path."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise InvalidInput(f"{field_path(path, first['loc'])}: {first['msg']}") from None


def check_body(body: Any, refused: dict[str, tuple[Any, str]]) -> None:
    """A body is a JSON object, and a refused field may only carry its neutral value."""
    if not isinstance(body, dict):
        raise InvalidInput("body: must be a JSON object")
    for name, (neutral, why) in refused.items():
        if name in body and not neutral(body[name]):
            raise InvalidInput(f"{name}: {why}")
