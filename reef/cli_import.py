"""`reef import FILE.jsonl`: records `reef export records` wrote, into a running server.

Each line of the export (reef/observe/export.py) becomes one item of `POST /reef/records/batch`
in the OpenAI dialect: the messages but the last as the request, the last (the assistant's
answer) as the response, the line's score (the mean of its reports) and feedback (one report's
text, or the texts joined) as one report, and the metadata's record id, scenario, session and
tags as the item's. So export -> import -> export gives the same lines (a record several reports
scored comes back with one report of their mean). Items go in batches of at most 1000 and
`--max-batch-bytes`, each stored whole or not at all; a retry imports nothing twice (the record
ids are the export's).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import click

from reef.client import ReefClient, ReefClientError

MAX_ITEMS = 1000
IMPORT_MODEL = "imported"  # an export names no model; the request records this one


def item_of(row: Any, line: int, scenario: str | None) -> dict[str, Any]:
    """One exported line as a batch item; `click.ClickException` naming the line if it is none."""
    if not isinstance(row, dict) or not isinstance(row.get("messages"), list) or not row["messages"]:
        raise click.ClickException(f"line {line}: not a line of `reef export records` (no messages)")
    *asked, answer = row["messages"]
    if not isinstance(answer, dict) or answer.get("role") != "assistant":
        raise click.ClickException(f"line {line}: the last message is not the assistant's answer (nothing to import)")
    meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    request: dict[str, Any] = {"model": IMPORT_MODEL, "messages": asked}
    if row.get("tools"):
        request["tools"] = row["tools"]
    message = {k: v for k, v in answer.items() if k in ("role", "content", "tool_calls")}
    reason = "tool_calls" if answer.get("tool_calls") else "stop"
    item: dict[str, Any] = {
        "dialect": "openai",
        "request": request,
        "response": {"model": IMPORT_MODEL, "choices": [{"index": 0, "message": message, "finish_reason": reason}]},
    }
    for key, value in (
        ("id", meta.get("record_id")),
        ("scenario", scenario or meta.get("scenario")),
        ("session", meta.get("session")),
        ("tags", meta.get("tags") or None),
        ("score", row.get("score")),
        ("feedback", _feedback(row.get("feedback")) if row.get("score") is not None else None),
    ):
        if value is not None:
            item[key] = value
    return item


def _feedback(texts: Any) -> str | None:
    if isinstance(texts, str):
        return texts
    if not isinstance(texts, list) or not texts:
        return None
    return texts[0] if len(texts) == 1 else "\n\n".join(str(t) for t in texts)


def batches(path: Path, scenario: str | None, max_bytes: int) -> Iterator[tuple[list[int], list[dict[str, Any]]]]:
    """(the line numbers, the items) of batches of at most MAX_ITEMS items and about `max_bytes` of JSON."""
    lines: list[int] = []
    batch: list[dict[str, Any]] = []
    size = 0
    with path.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except ValueError as exc:
                raise click.ClickException(f"line {number}: not JSON ({exc})") from None
            item = item_of(row, number, scenario)
            cost = len(json.dumps(item))
            if batch and (len(batch) >= MAX_ITEMS or size + cost > max_bytes):
                yield lines, batch
                lines, batch, size = [], [], 0
            lines.append(number)
            batch.append(item)
            size += cost
    if batch:
        yield lines, batch


def _refused(lines: list[int], exc: ReefClientError) -> click.ClickException:
    """The server's refusal of a batch, with the line its `records[i]` is."""
    named = re.match(r"records\[(\d+)\]", exc.message)
    where = f"line {lines[int(named.group(1))]}" if named and int(named.group(1)) < len(lines) else "a line"
    return click.ClickException(
        f"{where} was refused, with the batch of lines {lines[0]}-{lines[-1]} (none of it stored): {exc}"
    )


@click.command("import")
@click.option("--url", envvar="REEF_URL", default=None, help="Reef's address (REEF_URL).")
@click.option("--token", envvar="REEF_TOKEN", default=None, help="Bearer token (REEF_TOKEN).")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--scenario", help="Import every line into this scenario (default: the scenario each line names).")
@click.option(
    "--max-batch-bytes",
    type=click.IntRange(min=1024),
    default=16 * 1024 * 1024,
    show_default=True,
    help="Send a batch once it holds this much JSON (the server takes up to 16 times its max_body_bytes).",
)
def import_records(url: str | None, token: str | None, file: Path, scenario: str | None, max_batch_bytes: int) -> None:
    """Import FILE, a JSONL of `reef export records`, into a running server.

    Lines go in batches of up to 1000 (`POST /reef/records/batch`), each batch stored whole or
    not at all; progress goes to standard error. Each line keeps its record id, so running the
    import again after a failure stores nothing twice; a line whose id the server holds with
    other content stops the import (HTTP 409), naming it.

    \b
    Examples:
      reef export records coding --out coding.jsonl
      reef import coding.jsonl --url http://new-host:8900
      reef import coding.jsonl --scenario coding-copy
    """
    total = 0
    try:
        with ReefClient(url, token, timeout=300.0) as client:
            for lines, batch in batches(file, scenario, max_batch_bytes):
                try:
                    client.import_records(batch)
                except ReefClientError as exc:
                    raise _refused(lines, exc) from None
                total += len(batch)
                click.echo(f"imported {total} record(s) (through line {lines[-1]})", err=True)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"imported {total} record(s) from {file}")
