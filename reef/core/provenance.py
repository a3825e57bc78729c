"""Invariant 2: a record's tokens are trainable only if its spans prove where they came from."""

from __future__ import annotations

from reef.core.types import Record, TokenSpan


def spans_of(loads: list[str | None]) -> list[TokenSpan]:
    """Contiguous runs of generated tokens produced by one runtime load."""
    spans: list[TokenSpan] = []
    start = 0
    for i in range(1, len(loads) + 1):
        if i == len(loads) or loads[i] != loads[start]:
            spans.append(TokenSpan(start, i, loads[start] or "unknown"))
            start = i
    return spans


def verified(record: Record) -> bool:
    """Every generated token (and its log-prob) is covered, in order, by spans naming the
    runtime load of the release the request was frozen to."""
    tokens = record.token_ids or []
    if not tokens or not record.spans or record.release is None or record.release.runtime_load_id is None:
        return False
    expected, position = record.release.runtime_load_id, 0
    for span in record.spans:
        if span.start != position or span.end <= span.start or span.runtime_load_id != expected:
            return False
        position = span.end
    return position == len(tokens) and len(record.logprobs or []) == len(tokens)
