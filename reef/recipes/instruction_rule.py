"""An operator's instruction as a harness candidate: one rule that carries it.

The `skills` recipe turns each instruction (`reef/grow/instructions.py`) into a batch of its own
and this rule, whatever its proposer: the instruction is the operator's own words, so no model
rewrites it. It is stored as data: any text resembling a fence delimiter is made inert
(`reef.core.fence.neutralise`), so a proposer or judge that later reads the tree in a fenced block
cannot be steered out of it. The gate judges the candidate like any other.
"""

from __future__ import annotations

import hashlib

from reef.core.fence import neutralise
from reef.grow.instructions import Instruction
from reef.surfaces.harness import HarnessTree, Mutation

RULE_PREFIX = "instruction-"


def rule_name(instruction_id: str) -> str:
    return RULE_PREFIX + hashlib.sha256(instruction_id.encode()).hexdigest()[:12]


def instruction_rule(tree: HarnessTree, instruction: Instruction) -> Mutation:
    """The rule carrying `instruction` (an update if a rule of that instruction exists)."""
    name = rule_name(instruction.id)
    op = "update" if name in tree.rules else "create"
    return Mutation(op, "rule", name, neutralise(" ".join(instruction.text.split())))
