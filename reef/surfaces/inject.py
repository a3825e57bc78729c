"""Inject mode: the serving harness goes in front of each request's system prompt.

`HarnessInjector.inject(scenario, request, release)` is the one call the request path makes
after admission. It works on Reef's dialect-neutral `ChatRequest`, so OpenAI and Anthropic
clients (and runtimes) get the same text: the rendered harness (`render_system`) becomes the
start of the first system message, or a new first system message when the client sent none.

Trees are parsed once per content id (when the scenario's release is loaded, or on the first
request after an eviction) and kept by content id; a release without a harness costs a dict
lookup. The record keeps the request as sent to the runtime plus a `harness` entry saying what
was added, from which `client_request` restores the client's own request (retries compare that).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Mapping, Protocol

from reef.config import HarnessConfig
from reef.core.chat import ChatRequest, Message
from reef.core.errors import InvalidInput, NotFound
from reef.core.types import JSON, ReleaseRef
from reef.surfaces.harness import PREFIX, HarnessTree, render_with_skills

log = logging.getLogger(__name__)


class ReleaseFiles(Protocol):  # the artifact store, as far as injection reads it
    def files(self, release_id: str) -> dict[str, bytes]: ...


class ServingChain(Protocol):
    def serving(self) -> ReleaseRef: ...


class Chains(Protocol):  # reef's state: a scenario's chain by name (NotFound if none)
    def chain(self, name: str) -> ServingChain: ...


CONTROL_KEY = "control"  # harness config: {"release_id", "content_id", "fraction"} of a frozen control arm
SEPARATOR = "\n\n"  # between the injected harness and the client's own system prompt
EMPTY = HarnessTree()


class HarnessInjector:
    def __init__(self, config: HarnessConfig, artifacts: ReleaseFiles, max_trees: int = 64) -> None:
        self.config = config
        self.artifacts = artifacts
        self.max_trees = max_trees
        self._trees: OrderedDict[str, HarnessTree] = OrderedDict()

    # -- trees by content id ---------------------------------------------------------------

    def remember(self, content_id: str, files: Mapping[str, bytes]) -> HarnessTree:
        """Parse the harness of a release's files (called when the release is loaded)."""
        tree = self._trees.get(content_id)
        if tree is None:
            tree = _parse(content_id, files)
            self._trees[content_id] = tree
            while len(self._trees) > self.max_trees:
                self._trees.popitem(last=False)
        else:
            self._trees.move_to_end(content_id)
        return tree

    async def tree(self, release_id: str, content_id: str) -> HarnessTree:
        """The harness of a release, from the cache or (once) from the artifact store."""
        tree = self._trees.get(content_id)
        if tree is not None:
            return tree
        files = await asyncio.to_thread(self.artifacts.files, release_id)
        return self.remember(content_id, files)

    # -- the request path ------------------------------------------------------------------

    async def inject(self, scenario: str, request: ChatRequest, release: ReleaseRef) -> tuple[ChatRequest, JSON | None]:
        """The request to send to the runtime, and the record's `harness` entry (None when
        nothing was added: pull mode, or a release without a harness)."""
        tree = self._trees.get(release.content_id)
        if tree is None:
            tree = await self.tree(release.release_id, release.content_id)
        if tree is EMPTY or tree.is_empty or self.config.mode_for(scenario) != "inject":
            return request, None
        arm: dict[str, str] = {}
        control = control_arm(tree.config)
        if control is not None:
            if in_control(request, control):
                arm, tree = {"arm": "control"}, await self.tree(control["release_id"], control["content_id"])
            else:
                arm = {"arm": "treatment"}
        rendered, skills = render_with_skills(tree, request_text(request)) if not tree.is_empty else ("", [])
        if not rendered:  # a control arm with no harness: nothing added, but the arm is recorded
            return request, {
                "mode": "inject",
                "content_id": tree.content_id,
                "skills": [],
                "inserted": False,
                "prefix_chars": 0,
                **arm,
            }
        sent, inserted = with_system_prefix(request, rendered)
        added = {
            "mode": "inject",
            "content_id": tree.content_id,
            "skills": skills,
            "inserted": inserted,
            "prefix_chars": len(rendered) + (0 if inserted else len(SEPARATOR)),
            **arm,
        }
        return sent, added

    async def inject_current(self, state: Chains, scenario: str | None, request: ChatRequest) -> ChatRequest:
        """The request as the scenario's serving release would send it (for token counts);
        unchanged for a scenario that does not exist yet (counting never creates one)."""
        name = scenario or "default"
        try:
            chain = state.chain(name)
        except NotFound:
            return request
        return (await self.inject(name, request, chain.serving()))[0]


def control_arm(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The frozen control arm a harness names in its config (`skillclaw` sets it): the release
    whose harness serves `fraction` of conversations, or None."""
    control = config.get(CONTROL_KEY)
    if not isinstance(control, dict):
        return None
    fraction = control.get("fraction")
    if not (isinstance(control.get("release_id"), str) and isinstance(control.get("content_id"), str)):
        return None
    if not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        return None
    return control


def in_control(request: ChatRequest, control: Mapping[str, Any]) -> bool:
    """Whether a request's conversation falls in the control arm: by a hash of its first user
    message, so every turn of one conversation is served by one arm."""
    first = next((m.content for m in request.messages if m.role == "user" and m.content), "")
    digest = hashlib.sha256(f"{control['content_id']}\0{first}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < float(control["fraction"])


def request_text(request: ChatRequest) -> str:
    """What "the conversation mentions" is matched against: the text of every system, user and
    assistant message. Tool results are left out: they are mostly file contents and command
    output, the bulk of an agent's conversation, where a skill's name is no request for it."""
    return "\n".join(m.content for m in request.messages if m.content and m.role != "tool")


def with_system_prefix(request: ChatRequest, text: str) -> tuple[ChatRequest, bool]:
    """`request` with `text` at the start of its first system message; True when a new system
    message had to be inserted."""
    messages = request.messages
    if messages and messages[0].role == "system":
        first = replace(messages[0], content=text + SEPARATOR + messages[0].content)
        return replace(request, messages=(first, *messages[1:])), False
    return replace(request, messages=(Message(role="system", content=text), *messages)), True


def client_request(sent: JSON, harness: JSON | None) -> JSON:
    """The client's own request (as `ChatRequest.to_json` gave it) from a record's request as
    sent and its `harness` entry: what an idempotent retry must match."""
    if not harness or harness.get("mode") != "inject":
        return sent
    messages: list[Any] = list(sent.get("messages") or [])
    if harness.get("inserted"):
        messages = messages[1:]
    elif messages:
        first = dict(messages[0])
        first["content"] = first["content"][int(harness["prefix_chars"]) :]
        messages[0] = first
    return {**sent, "messages": messages}


def _parse(content_id: str, files: Mapping[str, bytes]) -> HarnessTree:
    if not any(path.startswith(PREFIX) for path in files):
        return EMPTY
    try:
        return HarnessTree.from_files(files)
    except InvalidInput as exc:  # never fail requests over it; the release serves without a harness
        log.error("content %s holds an invalid harness, served without it: %s", content_id, exc)
        return EMPTY
