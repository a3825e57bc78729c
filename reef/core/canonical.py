"""Canonical JSON, content hashes and identifiers.

Equality of durable things (records, reports, commit-log lines) is defined on their canonical
JSON, so a retry that sends the same content compares equal whatever its key order.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import uuid
from typing import Any, Mapping

from reef.core.errors import InvalidInput


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace; NaN, infinity and non-JSON values are `InvalidInput`."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"not storable as JSON: {exc}") from None


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def content_hash(value: Any) -> str:
    return sha256_hex(canonical_json(value))


def content_id_of(files: Mapping[str, bytes]) -> str:
    """A release content's id: 'sha256:' + sha256 of the canonical JSON list of
    [path, sha256(bytes)], sorted by path."""
    return "sha256:" + content_hash(sorted([p, sha256_hex(b)] for p, b in files.items()))


def new_id() -> str:
    """A random receipt or report id: 32 hex characters."""
    return uuid.uuid4().hex


_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # matched whole (fullmatch): no trailing newline
_SCENARIO_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_id(value: object, what: str = "id") -> str:
    """Client-chosen ids are short and path-safe: letters, digits, `.`, `_`, `:`, `-`."""
    if not isinstance(value, str) or not _ID_PATTERN.fullmatch(value) or ".." in value:
        raise InvalidInput(f"{what} must be 1-128 characters of letters, digits, '.', '_', ':' or '-', got {value!r}")
    return value


def check_scenario_name(value: object) -> str:
    if not isinstance(value, str) or not _SCENARIO_PATTERN.fullmatch(value) or ".." in value:
        raise InvalidInput(f"scenario name must be 1-128 characters of letters, digits, '.', '_' or '-', got {value!r}")
    return value


def check_finite(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{what} must be a finite number, got {value!r}")
    return float(value)


def check_depth(value: Any, limit: int, what: str) -> Any:
    """Free-form JSON a client stores (a tool's schema, a report's metadata) nests at most
    `limit` arrays and objects deep, so every record can be serialised and read back."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if type(node) is dict else node if type(node) is list else ()
        for child in children:
            if type(child) is dict or type(child) is list:
                if depth + 1 > limit:
                    raise InvalidInput(
                        f"{what} nests arrays and objects more than {limit} deep (limits.max_json_depth)"
                    )
                stack.append((child, depth + 1))
    return value


def scenario_key(name: str) -> str:
    """A file- and ref-safe key for a scenario name (urlsafe base64 without padding)."""
    return base64.urlsafe_b64encode(name.encode("utf-8")).decode("ascii").rstrip("=")
