"""Records as a chat dataset: one JSON line per record, streamed from the experience store.

Each line (`chat_example`) is what fine-tuning tools read (TRL, axolotl, OpenAI's fine-tuning
format, `datasets.load_dataset("json", data_files=...)`):

    {"messages": [... the request's messages in OpenAI chat format, then the assistant's answer ...],
     "tools": [... OpenAI function tools ...],            # only when the request offered tools
     "score": 0.75, "scores": [0.5, 1.0], "feedback": ["..."],
     "metadata": {"record_id", "scenario", "release_id", "session", "tags", "created_at", "status"}}

- `messages` are the request as the runtime saw it (in inject mode, with the harness in front of
  the system prompt), unless the caller passes `request_of` (`reef export records
  --client-messages` passes one built on `reef.surfaces.inject.client_request`, which restores
  the client's own request). The answer is appended as one assistant
  message (its text, and its tool calls); an `in_progress` record has none, an `incomplete`
  one has what was generated before it failed.
- At most one system message, first (`system_first`): chat templates reject or misplace any other.
- `score` is the mean of the scores of every report naming the record (null when none), and
  `scores` lists them, oldest first; `feedback` lists the reports' feedback, oldest first,
  a JSON-object feedback as its JSON text (one column type, so `datasets` can read it).
- `created_at` is when the store took the record, ISO 8601 in UTC.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import stat
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, TextIO

from reef.core.errors import InvalidInput
from reef.core.types import JSON, Record, RecordStatus
from reef.observe.store import ExperienceStore, StoredRecord

SYSTEM_JOIN = "\n\n"  # between system texts merged into one message
RequestOf = Callable[[Record], JSON]  # the request to export: as sent (default) or the client's own


@dataclass(frozen=True)
class RecordFilters:
    release_id: str | None = None
    statuses: Collection[RecordStatus] | None = (RecordStatus.COMPLETE,)  # None: any status
    since: float | None = None  # epoch seconds, inclusive
    until: float | None = None  # epoch seconds, exclusive
    min_score: float | None = None  # on `score` (the mean); a record without reports never passes
    max_score: float | None = None
    reported_only: bool = False

    def __post_init__(self) -> None:
        for name in ("min_score", "max_score", "since", "until"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise InvalidInput(f"{name} must be a finite number, got {value!r}")
        if self.min_score is not None and self.max_score is not None and self.min_score > self.max_score:
            raise InvalidInput(f"min_score {self.min_score} is above max_score {self.max_score}")


def examples(
    store: ExperienceStore,
    scenario: str,
    filters: RecordFilters = RecordFilters(),
    request_of: RequestOf | None = None,
    page_size: int = 500,
) -> Iterator[JSON]:
    """The chat examples of a scenario's records that pass `filters`, in record order, streamed."""
    scored = filters.min_score is not None or filters.max_score is not None
    items = store.iter_records(
        scenario,
        release_id=filters.release_id,
        statuses=filters.statuses,
        since=filters.since,
        until=filters.until,
        reported_only=filters.reported_only or scored,
        page_size=page_size,
    )
    for item in items:
        if item.record.tags.get("reef.kind") == "instruction":  # an operator's words (POST /reef/train), no exchange
            continue
        example = chat_example(item, request_of)
        score = example["score"]
        if filters.min_score is not None and (score is None or score < filters.min_score):
            continue
        if filters.max_score is not None and (score is None or score > filters.max_score):
            continue
        yield example


def refuse_link_or_special(path: Path, what: str = "a regular file") -> None:
    """`InvalidInput` (one line) if `path` is a symbolic link, or exists and is not `what` (a
    device such as /dev/stdout, a pipe, a socket): an export replaces what it writes and would
    turn any of them into a plain file, or write where the link points."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise InvalidInput(
            f"{path} is a symbolic link; name {what} itself (an export never replaces a link)"
            + (", or '-' for standard output" if what == "a regular file" else "")
        )
    wanted = stat.S_ISDIR if what == "a directory" else stat.S_ISREG
    if not wanted(mode):
        raise InvalidInput(
            f"{path} is not {what} (a device, pipe or socket is never replaced)"
            + ("; use '-' for standard output" if what == "a regular file" else "")
        )


def write_jsonl_file(path: Path, rows: Iterator[JSON]) -> int:
    """Write the rows to `path` whole or not at all: into a new file beside it (created, never
    opened, so a link planted there is not followed), then renamed over it. Refuses a `path`
    that is a link or not a regular file (`refuse_link_or_special`)."""
    refuse_link_or_special(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            count = write_jsonl(handle, rows)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return count


def write_jsonl(out: TextIO, rows: Iterator[JSON]) -> int:
    """Write one compact JSON object a line; returns how many."""
    count = 0
    for row in rows:
        out.write(json.dumps(row, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n")
        count += 1
    return count


def chat_example(item: StoredRecord, request_of: RequestOf | None = None) -> JSON:
    record = item.record
    request = request_of(record) if request_of is not None else record.request
    messages = system_first([_openai_message(m) for m in request.get("messages") or []])
    answer = _answer(record.response)
    if answer is not None:
        messages.append(answer)
    scores = [float(r.score) for r in item.reports]
    row: JSON = {"messages": messages}
    tools = [_openai_tool(t) for t in request.get("tools") or []]
    if tools:
        row["tools"] = tools
    row.update(
        {
            "score": sum(scores) / len(scores) if scores else None,
            "scores": scores,
            "feedback": [_feedback_text(r.feedback) for r in item.reports if r.feedback is not None],
            "metadata": {
                "record_id": record.id,
                "scenario": record.scenario,
                "release_id": record.release.release_id if record.release else None,
                "session": record.session,
                "tags": dict(record.tags),
                "created_at": iso_time(item.created_at),
                "status": record.status.value,
            },
        }
    )
    return row


def system_first(messages: list[JSON]) -> list[JSON]:
    """The messages with at most one system message, first, as chat templates want (several
    raise an exception on a system message anywhere else; others read only `messages[0]` as
    the system prompt). The system messages that open the conversation
    become one, their texts joined by a blank line. A system message later on (Claude Code
    sends some mid-conversation) keeps its place as user text: added to the user message before
    it, or else a user message of its own, which the user message right after it joins, so no
    two user messages follow each other where the request had none."""
    leading = next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))
    out: list[JSON] = []
    if leading:
        out.append({"role": "system", "content": SYSTEM_JOIN.join(_text(m) for m in messages[:leading])})
    absorbing = False  # the last message is a system message turned user text: a user turn joins it
    for m in messages[leading:]:
        if m.get("role") == "system":
            if out and out[-1].get("role") == "user":
                out[-1] = {**out[-1], "content": SYSTEM_JOIN.join((_text(out[-1]), _text(m)))}
            else:
                out.append({"role": "user", "content": _text(m)})
            absorbing = True
        elif m.get("role") == "user" and absorbing:
            out[-1] = {**m, "content": SYSTEM_JOIN.join((_text(out[-1]), _text(m)))}
            absorbing = False
        else:
            out.append(m)
            absorbing = False
    return out


def _text(message: JSON) -> str:
    content = message.get("content")
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def iso_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str) -> float:
    """Epoch seconds from `1767225600`, `1767225600.5`, `2026-01-01`, `2026-01-01T12:00:00`
    (UTC when no offset is given), `2026-01-01T12:00:00Z` or `...+02:00`."""
    value = text.strip()
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(number):
            raise InvalidInput(f"not a time: {text!r}")
        return number
    try:
        moment = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    except ValueError:
        raise InvalidInput(
            f"not a time: {text!r} (give ISO 8601, e.g. 2026-01-31T12:00:00Z, or epoch seconds)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


# -- Reef's recorded shapes -> OpenAI chat format ------------------------------------------------


def _openai_message(m: JSON) -> JSON:
    out: JSON = {"role": m.get("role"), "content": m.get("content", "")}
    if m.get("tool_calls"):
        out["tool_calls"] = [_openai_call(c) for c in m["tool_calls"]]
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    if m.get("name"):
        out["name"] = m["name"]
    return out


def _answer(response: JSON | None) -> JSON | None:
    if not response:
        return None
    out: JSON = {"role": "assistant", "content": response.get("text") or ""}
    calls = response.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [_openai_call(c) for c in calls]
    return out


def _openai_call(call: JSON) -> JSON:
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": call.get("name"), "arguments": call.get("arguments") or "{}"},
    }


def _openai_tool(tool: JSON) -> JSON:
    function: JSON = {"name": tool.get("name")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _feedback_text(feedback: Any) -> str:
    return feedback if isinstance(feedback, str) else json.dumps(feedback, ensure_ascii=False, sort_keys=True)
