"""The judge of `openclaw_rl`: a model that rates an answer by what happened right after it.

Any OpenAI- or Anthropic-compatible model (default: the scenario's own runtime) is asked m
times; each answer ends in `VERDICT: +1 | -1 | 0` (and, with hints on, `HINT: ...`). The most
common vote wins and a tie is 0. The client's text reaches the judge only inside fenced data
blocks (`reef/core/fence.py`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Sequence

from pydantic import Field

from reef.config import ModelEndpointConfig
from reef.core.chat import Message
from reef.core.fence import Fence
from reef.core.types import JSON, Record
from reef.recipes.session_turns import client_messages

_VERDICT = re.compile(r"VERDICT\s*:?\s*([+-]?)\s*([01])\b", re.IGNORECASE)
_HINT = re.compile(r"HINT\s*:\s*(.+)", re.IGNORECASE)

INSTRUCTIONS = """You judge one answer of an AI assistant by what happened right after it.
You see the last messages before the answer (context), the answer, and the next state: the
user's next message, or the results of the tools the answer called.
Rate the answer:
+1 if the next state shows it worked (the user accepts it, thanks, moves on to something new;
   the tool succeeded);
-1 if the next state shows it failed (the user corrects it, says it is wrong, repeats or
   rephrases the request, complains; the tool failed because of the answer);
0 if the next state says nothing either way.

{fence_rule}

Answer with the line `VERDICT: +1`, `VERDICT: -1` or `VERDICT: 0`.{hint_rule}"""

HINT_RULE = """
Then one line `HINT: <one short sentence>`: what the assistant should have known before it
answered, as the next state reveals it (`HINT: none` if it reveals nothing)."""


class JudgeConfig(ModelEndpointConfig):
    """The judge: any OpenAI- or Anthropic-compatible model (no `url`: the scenario's runtime)."""

    votes: int = Field(3, ge=1, description="Calls per turn; the most common vote wins, a tie is 0")
    max_tokens: int = Field(96, ge=1)
    temperature: float = Field(0.7, ge=0, description="Votes of a judge at 0 repeat one another")
    context_messages: int = Field(4, ge=0, description="Messages before the answer the judge is shown")
    excerpt_chars: int = Field(1500, ge=100, description="Most characters of one message shown to the judge")
    concurrency: int = Field(8, ge=1, description="Judge calls in flight at once")


def majority(votes: Sequence[int]) -> int:
    """The most common vote; a tie for the most is 0."""
    if not votes:
        return 0
    ranked = Counter(votes).most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return 0
    return ranked[0][0]


def parse_verdict(answer: str) -> tuple[int | None, str | None]:
    """(+1 / -1 / 0 from `VERDICT: ...`, or None; the `HINT: ...` line unless it is `none`)."""
    found = _VERDICT.search(answer)
    vote = None
    if found:
        vote = int(found.group(2)) * (-1 if found.group(1) == "-" else 1)
    hint = _HINT.search(answer)
    text = hint.group(1).strip() if hint else ""
    return vote, (text if text and text.lower().strip(". ") not in ("none", "n/a") else None)


def _as_text(message: JSON, limit: int) -> str:
    text = message.get("content") or ""
    if not isinstance(text, str):
        text = json.dumps(text)
    for call in message.get("tool_calls") or ():
        text += f"\n[calls tool {call.get('name')} with {call.get('arguments')}]"
    role = message.get("role", "?")
    if role == "tool":
        role = f"tool result{' ' + str(message['name']) if message.get('name') else ''}"
    text = text.strip()
    return f"{role}: {text[:limit]}{' …' if len(text) > limit else ''}"


def judge_messages(
    record: Record, next_state: Sequence[JSON], j: JudgeConfig, fence: Fence, hints: bool = False
) -> list[Message]:
    """The judge's prompt: the instructions, and the client's text only inside fenced data blocks."""
    system = INSTRUCTIONS.format(fence_rule=fence.rule(), hint_rule=HINT_RULE if hints else "")
    before = client_messages(record)
    context = (
        [_as_text(m, j.excerpt_chars) for m in before[len(before) - j.context_messages :]] if j.context_messages else []
    )
    response = record.response or {}
    answer = _as_text(
        {"role": "assistant", "content": response.get("text") or "", "tool_calls": response.get("tool_calls") or []},
        j.excerpt_chars,
    )
    parts = [
        "# Context",
        fence.block("context", "\n\n".join(context) or "(none)"),
        "# The answer to rate",
        fence.block("answer", answer),
        "# Next state",
        fence.block("next state", "\n\n".join(_as_text(m, j.excerpt_chars) for m in next_state)),
        "Now give your verdict.",
    ]
    return [Message("system", system), Message("user", "\n\n".join(parts))]
