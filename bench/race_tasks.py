"""`sentence`: the answer first, in one fixed sentence: a task for bench/learning_race.py.

"What is the opposite of hot? Answer with one sentence that starts with the answer." is answered
exactly by "Cold is the opposite of hot." (case, spacing and one final '.' or '!' aside): the
question with its "What" ("What language") replaced by the answer ("Japanese is spoken in
Japan."; plurals may say "are"). One worked example shows the form ("Blue is the colour of the
sky."; not a task). The facts and their three-way split are the demo's (reef.demo.tasks: 266 to
train on, 92 for the gate, 91 for the test), facts SmolLM2-135M mostly knows; what it lacks is
the form: greedily it answers "The opposite of hot is cold." whatever it is shown.

Verifier (`score`): 0 for a truncated reply (no end token), an empty one, one over
MAX_PARTIAL_WORDS words, or one without an accepted answer as a whole word (no answer is a word
of its question, so echoing the question earns nothing); 1.0 exact; else shaped partial credit
toward the form: 0.2 for the answer inside the reply, 0.4 if the reply starts with it, 0.6 if it
also ends with the question's word ("Cold, not hot."). The gate (`gate_score`, scorer
`race_tasks:gate_score`) and the race's evaluation count exact answers only.

Other shapes measured and dropped (temperature 1, 24 tokens, SmolLM2-135M-Instruct): two facts
in one answer ("What are the plurals of foot and mouse?" -> "feet and mice"): greedy 0%, but
sampled replies held both answers so rarely (mean shaped score 0.003-0.02) that nothing could be
learned from them; "hot -> cold" shown once: greedy 17.4%, not a 0% start.

Base rates of SmolLM2-135M-Instruct (fp32, bench/learning_race.py's evaluation: greedy, at most
EVAL_MAX_TOKENS tokens, exact and finished): test 3.3% (3/91: two capitals, one opposite), gate
held-out 1.1% (1/92); most replies are "The opposite of hot is cold." (0.2), and "Japanese is
the language spoken in Japan." (0.6) is the nearest miss. At temperature 1 (one sample of
each of the 266 training questions, TRAFFIC_MAX_TOKENS): exact 1.5%, starting with the answer
7.9% (languages 26%, the rest 4-7%), any credit 23.7%, mean score 0.072. It is learnable: in a
5-minute bare-loop run (23 steps on a shared machine) test success went 3.3% -> 18.7%.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from reef.demo import tasks as demo_tasks

INSTRUCTION = "Answer with one sentence that starts with the answer."
EXAMPLES = (("What colour is the sky?", "Blue is the colour of the sky."),)  # not a task
SHOWN_EXAMPLES = 1
MAX_PARTIAL_WORDS = 16
TRAFFIC_MAX_TOKENS = 24  # a sentence fits; a ramble is cut (and scores 0)
EVAL_MAX_TOKENS = 20  # the longest exact answer is 16 tokens with its end token
CREDIT_HAS, CREDIT_STARTS, CREDIT_FRAMED = 0.2, 0.4, 0.6

_FAMILIES = {  # family: (how the demo asks, the exact forms: {a} the answer, {k} the question's word)
    "opposite": (r"What is the opposite of (.+)\?", ("{a} is the opposite of {k}",)),
    "capital": (r"What is the capital of (.+)\?", ("{a} is the capital of {k}",)),
    "plural": (r"What is the plural of (.+)\?", ("{a} is the plural of {k}", "{a} are the plural of {k}")),
    "language": (r"What language is spoken in (.+)\?", ("{a} is spoken in {k}",)),
}


def _with_key(fact: dict[str, Any]) -> dict[str, Any]:
    match = re.fullmatch(_FAMILIES[fact["category"]][0], fact["question"])
    assert match, fact["question"]
    return {**fact, "key": match.group(1)}


def train_tasks() -> list[dict[str, Any]]:
    return [_with_key(t) for t in demo_tasks.train_tasks()]


def heldout_tasks() -> list[dict[str, Any]]:
    return [_with_key(t) for t in demo_tasks.heldout_tasks()]


def test_tasks() -> list[dict[str, Any]]:
    return [_with_key(t) for t in demo_tasks.test_tasks()]


def messages(task: dict[str, Any], examples: int = SHOWN_EXAMPLES) -> list[dict[str, str]]:
    turns: list[dict[str, str]] = []
    for question, answer in EXAMPLES[:examples]:
        turns += [{"role": "user", "content": f"{question} {INSTRUCTION}"}, {"role": "assistant", "content": answer}]
    return [*turns, {"role": "user", "content": f"{task['question']} {INSTRUCTION}"}]


def _normalise(text: str) -> str:
    reply = " ".join(text.strip().lower().split())
    return reply[:-1] if reply.endswith((".", "!")) else reply


def _word(word: str) -> str:
    return rf"(?<![\w-]){re.escape(word.lower())}(?![\w-])"


def exact_forms(task: dict[str, Any]) -> set[str]:
    key = task["key"].lower()
    return {form.format(a=a.lower(), k=key) for a in task["answers"] for form in _FAMILIES[task["category"]][1]}


def score(task: dict[str, Any], text: str, finish_reason: str = "stop") -> float:
    """1.0 exact; 0.2 / 0.4 / 0.6 partial credit toward the form; 0 truncated (module doc)."""
    reply = _normalise(text)
    if finish_reason != "stop" or not reply or len(reply.split()) > MAX_PARTIAL_WORDS:
        return 0.0
    if reply in exact_forms(task):
        return 1.0
    if not any(re.search(_word(a), reply) for a in task["answers"]):
        return 0.0
    if not any(re.match(_word(a), reply) for a in task["answers"]):
        return CREDIT_HAS
    return CREDIT_FRAMED if re.search(_word(task["key"]) + r"$", reply) else CREDIT_STARTS


def success(task: dict[str, Any], text: str, finish_reason: str = "stop") -> bool:
    return score(task, text, finish_reason) == 1.0


def gate_score(task: dict[str, Any], text: str) -> float:
    """The gate's scorer: exact answers only (the gate has no finish reason; see the demo's)."""
    return 1.0 if success(task, text) else 0.0


def feedback(task: dict[str, Any]) -> str:
    return "expected: " + sorted(exact_forms(task))[0].capitalize() + "."


def heldout_record(task: dict[str, Any], examples: int = SHOWN_EXAMPLES) -> dict[str, Any]:
    """A gate task as the gate reads it: the messages plus the scorer's fields."""
    return {"messages": messages(task, examples), **task}


def write_heldout_jsonl(path: Path, examples: int = SHOWN_EXAMPLES) -> Path:
    """The gate's tasks, one JSON object a line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(heldout_record(t, examples)) + "\n" for t in heldout_tasks()))
    return path
