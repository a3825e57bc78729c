"""The LLM proposer: a model reads the failures, their feedback and the current harness, and
answers with mutations as JSON.

The answer must be one JSON object `{"mutations": [...]}` (a fenced ```json block is accepted),
checked against a schema (pydantic, then `Mutation.from_json`) and applied to the tree; anything
that fails is sent back to the model with the error, up to TRIES calls, and then the batch is
skipped with the reason (logged in the chain, counted in the learner status).

Client text (prompts, answers, feedback) reaches the model only inside fenced data blocks
(`reef/core/fence.py`) and the instructions say it is data, never to be followed; the harness
itself is Reef's own text and is shown the same way, since clients' feedback shaped it.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, ValidationError

from reef.core.chat import Message
from reef.core.errors import InvalidInput, RuntimeFailure
from reef.core.fence import Fence
from reef.core.types import ReleaseRef
from reef.recipes.skills import Batch, Observation, Proposal, ProposalFailed, SkillsConfig
from reef.runtimes.endpoint import ModelEndpoint
from reef.surfaces.harness import HarnessTree, Mutation

EXCERPT = 1200
MAX_MUTATIONS = 8
TRIES = 3  # calls a batch before invalid output is skipped
_FENCED_JSON = re.compile(r"```(?:json)?\s*\n(.*?)\n\s*```", re.DOTALL)

INSTRUCTIONS = """You improve the harness of an AI agent: its system prompt, rules and skills.
Below are exchanges users scored as failures (with their feedback), a few successes for
contrast, and the current harness. Propose the smallest set of changes that would make the
failures succeed without breaking the successes: create, update or remove rules (short,
general instructions) or skills (a name, a one-line description, and a body of instructions).

{fence_rule}

Answer with ONE JSON object and nothing else, of this shape:
{{"mutations": [{{"op": "create|update|remove", "kind": "rule|skill|system", "name": "lower-case-name",
  "body": "the whole new text", "description": "skills only: one line"}}]}}
Names match [a-z0-9][a-z0-9-_]{{0,63}}. `create` needs a new name, `update`/`remove` an existing one.
At most {max_mutations} mutations; an empty list if nothing should change."""


class MutationModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: str
    kind: str
    name: str = "system"
    body: str = ""
    description: str = ""


class ProposalModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mutations: list[MutationModel]


class LLMProposer:
    name = "llm"
    needs_feedback = False

    def __init__(self, config: SkillsConfig, endpoint: ModelEndpoint) -> None:
        self.config = config
        self.endpoint = endpoint

    def select(self, failures: Sequence[Observation], tree: HarnessTree) -> list[Observation]:
        if len(failures) < self.config.batch_size:
            return []
        return sorted(failures, key=lambda o: o.score)[: self.config.batch_size]

    async def propose(self, tree: HarnessTree, batch: Batch, serving: ReleaseRef) -> Proposal:
        messages = prompt_messages(tree, batch, Fence())
        errors: list[str] = []
        for attempt in range(1, TRIES + 1):
            try:
                answer = await self.endpoint.ask(messages, serving)
            except RuntimeFailure as exc:
                errors.append(f"try {attempt}: the model failed: {exc}")
                continue
            try:
                mutations = parse_mutations(answer, tree)
            except InvalidInput as exc:
                errors.append(f"try {attempt}: {exc}")
                messages = [
                    *messages,
                    Message("assistant", answer[:EXCERPT]),
                    Message("user", f"That answer was invalid: {exc}. Answer again with only the JSON object."),
                ]
                continue
            if not mutations:
                raise ProposalFailed("no_change", "the model proposed no change")
            return Proposal(tuple(mutations), {"proposer": self.name, "tries": attempt, "model": self.endpoint.where})
        raise ProposalFailed("invalid_output", f"no valid proposal after {TRIES} tries: " + "; ".join(errors))

    async def close(self) -> None:
        await self.endpoint.close()


def parse_mutations(answer: str, tree: HarnessTree) -> list[Mutation]:
    """The mutations in a model's answer, checked against the schema and the tree."""
    data = _json_of(answer)
    try:
        proposal = ProposalModel.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"the JSON does not fit the schema ({where}: {first['msg']})") from None
    if len(proposal.mutations) > MAX_MUTATIONS:
        raise InvalidInput(f"{len(proposal.mutations)} mutations; at most {MAX_MUTATIONS}")
    mutations = [Mutation.from_json(m.model_dump(exclude_defaults=True)) for m in proposal.mutations]
    tree.apply(mutations)  # InvalidInput when one does not fit the tree
    return mutations


def _json_of(answer: str) -> Any:
    text = answer.strip()
    fenced = _FENCED_JSON.search(text)
    if fenced:
        text = fenced.group(1)
    try:
        return json.loads(text)
    except ValueError:
        pass
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise InvalidInput("the answer holds no JSON object")
    try:
        return json.loads(text[start : end + 1])
    except ValueError as exc:
        raise InvalidInput(f"the answer is not valid JSON ({exc})") from None


def prompt_messages(tree: HarnessTree, batch: Batch, fence: Fence) -> list[Message]:
    system = INSTRUCTIONS.format(fence_rule=fence.rule(), max_mutations=MAX_MUTATIONS)
    parts = ["# Current harness", _harness_blocks(tree, fence), "# Failures"]
    parts += [_exchange(i, o, fence) for i, o in enumerate(batch.failures, 1)]
    if batch.successes:
        parts.append("# Successes")
        parts += [_exchange(i, o, fence) for i, o in enumerate(batch.successes, 1)]
    parts.append("Now answer with the JSON object of mutations.")
    return [Message("system", system), Message("user", "\n\n".join(parts))]


def _exchange(index: int, obs: Observation, fence: Fence) -> str:
    lines = [
        f"## Exchange {index} (score {obs.score:g})",
        fence.block("prompt", obs.prompt[-EXCERPT:]),
        fence.block("answer", obs.response[:EXCERPT]),
    ]
    if obs.feedback:
        lines.append(fence.block("feedback", obs.feedback[:EXCERPT]))
    return "\n".join(lines)


def _harness_blocks(tree: HarnessTree, fence: Fence) -> str:
    if tree.is_empty:
        return "(empty: no system prompt, rules or skills yet)"
    blocks = []
    if tree.system:
        blocks.append(fence.block("system", tree.system))
    blocks += [fence.block(f"rule {name}", body) for name, body in sorted(tree.rules.items())]
    blocks += [fence.block(f"skill {name}: {s.description}", s.body) for name, s in sorted(tree.skills.items())]
    return "\n".join(blocks)
