"""The demo's task stream: one-word factual questions and a strict verifier.

208 questions in seven families (opposites, colours of things, animal young, animal sounds,
capitals, plurals, sums and differences up to 10), each with the set of answers accepted. A
question is asked as "<question> Answer with one word." after SHOWN_EXAMPLES worked examples
given as earlier turns (EXAMPLES; none of them is a task). A deterministic split holds out every
fourth question of each family, ordered by a hash of the question: 56 held out (the gate's
tasks, never asked by live traffic), 152 for training.

The verifier checks content, not only form (EMBEDDED_MODEL.md: format-only rewards get gamed):
1.0 only for a reply that, stripped, lowercased and without one trailing '.' or '!', *is* an
accepted answer and finished on its own ("stop"; a truncated reply fails); 0.25 when an accepted
answer appears as a whole word in a short reply (at most 12 words) that finished; else 0.
Repeating the answer ("cold cold cold") earns only the partial credit. The gate counts exact
successes only (`gate_score`).

Base rates of SmolLM2-135M-Instruct on the 56 held-out questions (fp32), exact / partial:
| worked examples | greedy | temperature 1 (2 samples each) |
|---:|---:|---:|
| 0 | 0% / 46.4% (sentences: "The opposite of hot is cold.") | 0.9% / 8.9% |
| 1 (the default) | 17.9% / 3.6% | 7.1% / 2.7% |
| 2 | 17.9% / 0% | 5.4% / 0.9% |
| 3 | 26.8% / 1.8% | 12.5% / 2.7% |
A common failure is echoing the question's own word ("plural of leaf?" -> "Leaf"). What
supervised LoRA training on the 152 training questions' answers reaches on the held-out ones
(r=16, lr 5e-4, batches of 8; an upper mark for what learning from scores can find): with 3
examples 48.2% / 51.8% / 55.4% after 1 / 2 / 3 epochs, with 1 example 48.2% / 51.8%. With 0
examples the base model never answers in one word, and exact-match learning has nothing to
grow from (run 9 in docs/learning.md).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterable

INSTRUCTION = "Answer with one word."
PARTIAL_CREDIT = 0.25
MAX_PARTIAL_WORDS = 12
# Worked examples shown before each question; none of them is a task.
EXAMPLES = (("What colour is the sky?", "Blue"), ("What is the opposite of wide?", "Narrow"), ("What is 2 plus 2?", "4"))
SHOWN_EXAMPLES = 1  # see the module doc: 3 leave too little room above the base model
HELDOUT_EVERY = 4  # one question in four of each family (by hash) is held out

# "key:answer|answer" rows per family; the question is built from the key.
_OPPOSITES = """hot:cold big:small|little up:down day:night black:white left:right fast:slow happy:sad
open:closed|shut wet:dry tall:short full:empty in:out yes:no win:lose early:late rich:poor thick:thin
clean:dirty strong:weak push:pull first:last top:bottom true:false love:hate north:south east:west
buy:sell high:low near:far above:below alive:dead inside:outside heavy:light question:answer
friend:enemy|foe sweet:sour|bitter loud:quiet|soft asleep:awake before:after never:always
empty:full cheap:expensive|dear young:old laugh:cry"""
_COLOURS = """grass:green snow:white coal:black blood:red banana:yellow carrot:orange lemon:yellow
milk:white pumpkin:orange crow:black tomato:red cucumber:green chocolate:brown salt:white
strawberry:red lime:green soot:black|grey|gray charcoal:black|grey|gray cherry:red coffee:brown|black
chalk:white ivory:white emerald:green ruby:red sapphire:blue"""
_YOUNG = """cat:kitten|kitty dog:puppy|pup cow:calf sheep:lamb horse:foal|colt|filly duck:duckling goat:kid
pig:piglet frog:tadpole|froglet bear:cub lion:cub chicken:chick goose:gosling kangaroo:joey
owl:owlet swan:cygnet deer:fawn tiger:cub"""
_SOUNDS = """dog:bark|barks|woof cat:meow|meows|miaow|mew|purr cow:moo|moos duck:quack|quacks
sheep:baa|bleat|bleats pig:oink|oinks lion:roar|roars horse:neigh|neighs|whinny snake:hiss|hisses
owl:hoot|hoots bee:buzz|buzzes mouse:squeak|squeaks frog:croak|croaks|ribbit wolf:howl|howls
donkey:bray|brays|hee-haw"""
_CAPITALS = """France:paris Japan:tokyo Italy:rome Germany:berlin Spain:madrid England:london
Russia:moscow China:beijing Egypt:cairo Greece:athens Canada:ottawa Australia:canberra
Ireland:dublin Portugal:lisbon Norway:oslo Sweden:stockholm Finland:helsinki Denmark:copenhagen
Austria:vienna Poland:warsaw Hungary:budapest Belgium:brussels Thailand:bangkok Kenya:nairobi
Peru:lima Cuba:havana Turkey:ankara Scotland:edinburgh Wales:cardiff Vietnam:hanoi
Indonesia:jakarta Philippines:manila Ukraine:kyiv|kiev Iraq:baghdad Iran:tehran|teheran
Chile:santiago Czechia:prague Nigeria:abuja"""
_PLURALS = """mouse:mice child:children foot:feet tooth:teeth man:men woman:women goose:geese
person:people|persons leaf:leaves knife:knives wolf:wolves box:boxes baby:babies city:cities
ox:oxen fish:fish|fishes sheep:sheep deer:deer bus:buses|busses potato:potatoes hero:heroes
wife:wives half:halves life:lives glass:glasses church:churches dish:dishes story:stories
berry:berries cactus:cacti|cactuses"""
_NUMBER_WORDS = "zero one two three four five six seven eight nine ten".split()

_QUESTION = {
    "opposite": "What is the opposite of {}?",
    "colour": "What colour is {}?",
    "young": "What is a baby {} called?",
    "sound": "What sound does a {} make?",
    "capital": "What is the capital of {}?",
    "plural": "What is the plural of {}?",
}
_THE = {"grass", "snow", "coal", "blood", "milk", "salt", "soot", "charcoal", "coffee", "chalk", "ivory", "chocolate"}


def _rows(table: str) -> Iterable[tuple[str, list[str]]]:
    for item in table.split():
        key, answers = item.split(":")
        yield key, answers.split("|")


def _colour_subject(key: str) -> str:
    if key in _THE:
        return key
    return ("an " if key[0] in "aeiou" else "a ") + key


def _build() -> tuple[dict[str, Any], ...]:
    tasks: list[dict[str, Any]] = []
    families = [("opposite", _OPPOSITES), ("colour", _COLOURS), ("young", _YOUNG), ("sound", _SOUNDS),
                ("capital", _CAPITALS), ("plural", _PLURALS)]
    for family, table in families:
        for key, answers in _rows(table):
            subject = _colour_subject(key) if family == "colour" else key
            tasks.append({"question": _QUESTION[family].format(subject), "answers": answers, "category": family})
    for a in range(1, 10):  # sums up to 10 and differences, answered in digits (or the word)
        for b in range(1, 11 - a):
            if (a * 7 + b * 3) % 2 == 0:
                continue  # keep about half of the sums, so arithmetic does not dominate
            tasks.append({"question": f"What is {a} plus {b}?", "answers": [str(a + b), _NUMBER_WORDS[a + b]],
                          "category": "arithmetic"})
    for a in range(3, 11):
        for b in range(1, a, 3):
            tasks.append({"question": f"What is {a} minus {b}?", "answers": [str(a - b), _NUMBER_WORDS[a - b]],
                          "category": "arithmetic"})
    questions = [t["question"] for t in tasks]
    assert len(questions) == len(set(questions)), "duplicate demo question"
    assert not {q for q, _ in EXAMPLES} & set(questions), "a worked example is also a task"
    return tuple(tasks)


TASKS: tuple[dict[str, Any], ...] = _build()


def _digest(question: str) -> str:
    return hashlib.sha256(question.encode()).hexdigest()


def _heldout_questions() -> frozenset[str]:
    """Within each family, order the questions by a hash and hold out every fourth: stable across
    runs, machines and Python's hash seed, and every family is represented in the held-out set."""
    chosen: set[str] = set()
    for family in sorted({t["category"] for t in TASKS}):
        ranked = sorted((t["question"] for t in TASKS if t["category"] == family), key=_digest)
        chosen.update(ranked[::HELDOUT_EVERY])
    return frozenset(chosen)


_HELDOUT = _heldout_questions()


def is_heldout(question: str) -> bool:
    return question in _HELDOUT


def train_tasks() -> list[dict[str, Any]]:
    return [t for t in TASKS if not is_heldout(t["question"])]


def heldout_tasks() -> list[dict[str, Any]]:
    return [t for t in TASKS if is_heldout(t["question"])]


def user_prompt(task: dict[str, Any]) -> str:
    return f"{task['question']} {INSTRUCTION}"


def messages(task: dict[str, Any], examples: int = SHOWN_EXAMPLES) -> list[dict[str, str]]:
    """The first `examples` worked examples as earlier turns, then the question."""
    turns: list[dict[str, str]] = []
    for question, answer in EXAMPLES[:examples]:
        turns += [{"role": "user", "content": f"{question} {INSTRUCTION}"}, {"role": "assistant", "content": answer}]
    return [*turns, {"role": "user", "content": user_prompt(task)}]


def _normalise(text: str) -> str:
    reply = text.strip().lower()
    if reply.endswith((".", "!")):
        reply = reply[:-1]
    return reply


def score(task: dict[str, Any], text: str, finish_reason: str = "stop") -> float:
    """1.0 exact, 0.25 the answer inside a short finished reply, else 0 (see module doc)."""
    if finish_reason != "stop" or not text:
        return 0.0
    answers = [a.lower() for a in task["answers"]]
    reply = _normalise(text)
    if reply in answers:
        return 1.0
    if len(reply.split()) > MAX_PARTIAL_WORDS:
        return 0.0
    for answer in answers:
        if re.search(rf"(?<![\w-]){re.escape(answer)}(?![\w-])", reply):
            return PARTIAL_CREDIT
    return 0.0


def success(task: dict[str, Any], text: str, finish_reason: str = "stop") -> bool:
    return score(task, text, finish_reason) == 1.0


def gate_score(task: dict[str, Any], text: str) -> float:
    """The gate's scorer (`reef.demo.tasks:gate_score`): success, 1 or 0, the measure the demo
    is about. Partial credit shapes the training reward, but a candidate that trades exact
    answers for more answers-inside-a-sentence is not better. The gate has no finish reason,
    so the text is judged as it is; a reply cut off at the token limit fails on its words."""
    return 1.0 if score(task, text, "stop") == 1.0 else 0.0


def feedback(task: dict[str, Any]) -> str:
    return "expected one of: " + ", ".join(task["answers"])


def heldout_record(task: dict[str, Any], examples: int = SHOWN_EXAMPLES) -> dict[str, Any]:
    return {"messages": messages(task, examples), "answers": list(task["answers"]), "question": task["question"],
            "category": task["category"]}


def write_heldout_jsonl(path: Path, examples: int = SHOWN_EXAMPLES) -> Path:
    """The held-out tasks, one JSON object a line, in the form the gate reads."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(heldout_record(t, examples)) + "\n" for t in heldout_tasks()))
    return path


def read_tasks_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
