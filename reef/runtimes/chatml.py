"""ChatML for SmolLM2: prompts from messages and tools (as turns, or as the token ids a runtime
that tokenizes itself sends), tool calls parsed from output, and output text decoded
incrementally (stop strings, split characters, tool-call holdback).

No runtime state lives here; the runtimes (embedded, vLLM, SGLang) and the learner share these
functions. Sampling is `sampling.py`'s.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any, Callable

from reef.core.chat import ChatRequest, Message, Tool, ToolCall

MAX_CONTEXT = 2048  # the embedded model's context as served: prompt and answer together, in tokens
STOP_TOKENS = ("<|im_end|>", "<|im_start|>", "<|endoftext|>")  # EOS 2, im_start 1, endoftext 0
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
_TOOL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)

# -- prompt: the chat template over messages, tools as a system-prompt instruction --------------


def chat_messages(request: ChatRequest) -> list[dict[str, str]]:
    """The request as plain ChatML turns. SmolLM2's template knows nothing of tools, so tools
    go into the system prompt and tool calls and results into the turns' text, in the
    `<tool_call>` convention the model is asked to answer in."""
    messages = [_message_dict(m) for m in request.messages]
    if request.tools and request.tool_choice != "none":
        instruction = _tool_instruction(request.tools, request.tool_choice)
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{instruction}"
        else:
            messages.insert(0, {"role": "system", "content": instruction})
    return messages


def prompt_ids(tokenizer: Any, request: ChatRequest) -> list[int]:
    """The prompt's token ids: the tokenizer's chat template over `chat_messages`, the assistant
    turn opened. The runtimes that tokenize themselves (embedded, SGLang) share it, so an engine
    is given the very tokens the embedded model would be."""
    text = tokenizer.apply_chat_template(chat_messages(request), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of the `STOP_TOKENS` the tokenizer knows: an answer ends at any of them."""
    ids = (tokenizer.convert_tokens_to_ids(t) for t in STOP_TOKENS)
    return frozenset(i for i in ids if isinstance(i, int) and i >= 0)


def _message_dict(message: Message) -> dict[str, str]:
    parts = [message.content] if message.content else []
    for call in message.tool_calls:
        body = {"name": call.name, "arguments": _json_or_text(call.arguments)}
        parts.append(f"{TOOL_OPEN}{json.dumps(body)}{TOOL_CLOSE}")
    return {"role": message.role, "content": "\n".join(parts)}


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _tool_instruction(tools: tuple[Tool, ...], tool_choice: Any) -> str:
    listing = json.dumps(
        [{"name": t.name, "description": t.description or "", "parameters": t.parameters} for t in tools]
    )
    text = (
        f"You can call these tools:\n{listing}\nTo call a tool, answer with "
        f'{TOOL_OPEN}{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}{TOOL_CLOSE}'
    )
    forced = (
        tool_choice.get("name") or (tool_choice.get("function") or {}).get("name")
        if isinstance(tool_choice, dict)
        else None
    )
    if forced:
        text += f"\nYou must call the tool {forced}."
    elif tool_choice == "required":
        text += "\nYou must call a tool."
    return text


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>{...}</tool_call>` block, or none at all if any block is malformed
    (then the text is answered as text rather than half-parsed)."""
    calls = []
    for body in _TOOL_BLOCK.findall(text):
        try:
            obj = json.loads(body)
        except ValueError:
            return []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return []
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(
            ToolCall(f"call_{secrets.token_hex(12)}", obj["name"], args if isinstance(args, str) else json.dumps(args))
        )
    return calls


# -- output text: incremental decoding, stop strings, tool-call holdback ---------------------------


class TextStream:
    """Turns the growing list of token ids into text that is safe to release: no half
    multi-byte character, nothing that may still become a stop string (stops are cut, as
    OpenAI does), nothing from a `<tool_call>` on (it is parsed at the end instead)."""

    def __init__(self, decode: Callable[[list[int]], str], stops: tuple[str, ...], watch_tools: bool) -> None:
        self.decode = decode
        self.stops = tuple(s for s in stops if s)
        self.markers = self.stops + ((TOOL_OPEN,) if watch_tools else ())
        self.watch_tools = watch_tools
        self.text = ""
        self.sent = 0
        self.stopped = False
        self.tool_at: int | None = None

    def push(self, ids: list[int]) -> str:
        text = self.decode(ids)
        if text.endswith("\ufffd"):
            return ""  # the last token ends inside a multi-byte character; wait for the rest
        self._update(text)
        if self.tool_at is not None:
            return self._release(self.tool_at)
        held = 0 if self.stopped else _partial_suffix(self.text, self.markers)
        return self._release(len(self.text) - held)

    def finish(self, ids: list[int]) -> tuple[str, list[ToolCall]]:
        """The rest of the text, or the parsed tool calls that replace it."""
        if not self.stopped:
            self._update(self.decode(ids))
        if self.tool_at is not None:
            calls = parse_tool_calls(self.text[self.tool_at :])
            if calls:
                return "", calls
        return self._release(len(self.text)), []

    def _update(self, text: str) -> None:
        cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if cuts:
            text, self.stopped = text[: min(cuts)], True
        self.text = text
        if self.watch_tools and self.tool_at is None and TOOL_OPEN in text:
            self.tool_at = text.index(TOOL_OPEN)

    def _release(self, limit: int) -> str:
        out = self.text[self.sent : limit] if limit > self.sent else ""
        self.sent = max(self.sent, limit)
        return out


def _partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that begins one of `markers`."""
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best
