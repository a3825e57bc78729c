"""The demo's task stream: one-word factual questions and a strict verifier.

449 questions in four families (opposites, capitals, plurals, languages spoken in a country),
each with the set of answers accepted. A question is asked as "<question> Answer with one
word." after SHOWN_EXAMPLES worked examples given as earlier turns (EXAMPLES; none of them is a
task). A deterministic split, by a hash of the question within each family, makes three parts:
92 held out (the gate's tasks, never asked by live traffic), 91 for the final test (asked only
of the starting and the final release, never reported: nothing is selected on them) and 266
for training.

The families are those whose answers SmolLM2-135M mostly knows but does not give in one word:
asked bare, it names the answer in a sentence ("The plural of foot is feet.") for 64-94% of
them. Learning from scores can turn knowledge it has into the asked form; it cannot teach a
held-out fact it lacks. Families it did not know (colours of things: "lemon" -> "Red"; animal
young and sounds; sums) were in an earlier task set and were never answered on held-out
questions by any release learned. No answer is a word of its
question, so echoing the question ("plural of leaf?" -> "Leaf", a common failure) never counts.

The verifier checks content, not only form (docs/learning.md: format-only rewards get gamed):
1.0 only for a reply that, stripped, lowercased and without one trailing '.' or '!', *is* an
accepted answer and finished on its own ("stop"; a truncated reply fails); 0.25 when an accepted
answer appears as a whole word in a short reply (at most 12 words) that finished; else 0.
Repeating the answer ("cold cold cold") earns only the partial credit. The gate counts exact
successes only (`gate_score`).

Base rates of SmolLM2-135M-Instruct on the 92 held-out questions (fp32, as the gate asks them:
at most 8 tokens), exact / partial:
| worked examples | greedy | temperature 1 (2 samples each, 16 tokens) |
|---:|---:|---:|
| 0 | 0% | 0% / 14.1% |
| 1 (the default) | 16.3% (opposites 8/37, capitals 3/17, plurals 1/28, languages 3/10) | 8.7% / 6.5% |
| 2 | 20.7% | 7.1% / 2.2% |
| 3 | 20.7% | 8.2% / 4.3% |
On the 91 test questions, one example: 16.5% greedy.
With 0 examples the base model never answers in one word, and exact-match learning has nothing
to grow from: partial credit alone did not teach the form within 15 minutes.
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
EXAMPLES = (
    ("What colour is the sky?", "Blue"),
    ("What is the opposite of wide?", "Narrow"),
    ("What is 2 plus 2?", "4"),
)
SHOWN_EXAMPLES = 1  # one example shows the form and leaves room to learn it; with none it is never learned
HELDOUT_EVERY = 5  # of each family, one question in five (by hash) is held out for the gate, one for the test

# "key:answer|answer" rows per family; the question is built from the key ("-" in a key is a space).
# Only one-word answers, and only families whose answers SmolLM2-135M mostly knows (module doc).
_OPPOSITES = """hot:cold big:small|little up:down day:night black:white left:right fast:slow happy:sad|unhappy
open:closed|shut wet:dry tall:short full:empty in:out yes:no win:lose early:late rich:poor thick:thin
clean:dirty strong:weak push:pull first:last top:bottom true:false love:hate north:south east:west
buy:sell high:low near:far above:below alive:dead inside:outside heavy:light question:answer
friend:enemy|foe sweet:sour|bitter loud:quiet|soft asleep:awake before:after never:always
cheap:expensive|dear young:old laugh:cry hard:soft|easy good:bad|evil long:short old:new|young
light:dark|heavy start:finish|end|stop begin:end come:go give:take|receive front:back hello:goodbye|bye
over:under on:off boy:girl man:woman king:queen brother:sister father:mother son:daughter
husband:wife uncle:aunt many:few more:less most:least best:worst everything:nothing war:peace
remember:forget accept:reject|refuse|decline arrive:leave|depart ancient:modern|new beautiful:ugly
brave:cowardly|afraid|scared|coward correct:incorrect|wrong dangerous:safe deep:shallow
difficult:easy|simple entrance:exit enter:exit|leave fat:thin|skinny|slim female:male floor:ceiling
forward:backward|backwards|back future:past gentle:rough|harsh generous:selfish|stingy|mean
guilty:innocent healthy:sick|ill|unhealthy hungry:full|satisfied include:exclude increase:decrease|reduce
interesting:boring|dull kind:cruel|unkind|mean lazy:hardworking|hard-working|active|busy legal:illegal
lend:borrow maximum:minimum melt:freeze|solidify noisy:quiet|silent odd:even polite:rude|impolite
private:public pretty:ugly rough:smooth|gentle sharp:blunt|dull shout:whisper sink:float smile:frown
solid:liquid success:failure sunrise:sunset teacher:student|pupil tight:loose
tiny:huge|enormous|giant|big|large together:apart|separate|alone visible:invisible
wild:tame winter:summer wise:foolish|stupid|unwise add:subtract agree:disagree attack:defend
bright:dark|dim clever:stupid|foolish|dumb cold:hot|warm cool:warm|hot dark:light|bright different:same|similar
dirty:clean fail:pass|succeed few:many|several find:lose child:adult|parent cloudy:sunny|clear
crooked:straight destroy:create|build|make down:up easy:hard|difficult export:import fresh:stale|rotten
hate:love heaven:hell horizontal:vertical import:export inner:outer junior:senior land:sea|water
lie:truth major:minor mountain:valley narrow:wide|broad natural:artificial|unnatural night:day
noon:midnight obey:disobey optimist:pessimist patient:impatient plural:singular positive:negative
quick:slow rare:common raw:cooked sad:happy same:different sell:buy send:receive short:tall|long
silent:noisy|loud simple:complex|complicated|difficult slow:fast|quick small:big|large|huge sour:sweet
thin:thick|fat ugly:beautiful|pretty vertical:horizontal victory:defeat warm:cold|cool weak:strong
white:black wrong:right|correct"""
_CAPITALS = """France:paris Japan:tokyo Italy:rome Germany:berlin Spain:madrid England:london
Russia:moscow China:beijing Egypt:cairo Greece:athens Canada:ottawa Australia:canberra
Ireland:dublin Portugal:lisbon Norway:oslo Sweden:stockholm Finland:helsinki Denmark:copenhagen
Austria:vienna Poland:warsaw Hungary:budapest Belgium:brussels Thailand:bangkok Kenya:nairobi
Peru:lima Cuba:havana Turkey:ankara Scotland:edinburgh Wales:cardiff Vietnam:hanoi
Indonesia:jakarta Philippines:manila Ukraine:kyiv|kiev Iraq:baghdad Iran:tehran|teheran
Chile:santiago Czechia:prague Nigeria:abuja Netherlands:amsterdam Switzerland:bern|berne
Iceland:reykjavik Romania:bucharest Bulgaria:sofia Serbia:belgrade Croatia:zagreb Slovakia:bratislava
Slovenia:ljubljana Estonia:tallinn Latvia:riga Lithuania:vilnius Belarus:minsk Georgia:tbilisi
Armenia:yerevan Jordan:amman Lebanon:beirut Syria:damascus Afghanistan:kabul Pakistan:islamabad
Nepal:kathmandu Bangladesh:dhaka South-Korea:seoul Ghana:accra Senegal:dakar Morocco:rabat
Algeria:algiers Tunisia:tunis Libya:tripoli Sudan:khartoum Uganda:kampala Zimbabwe:harare
Venezuela:caracas Colombia:bogota|bogotá Ecuador:quito Uruguay:montevideo Paraguay:asuncion|asunción
Jamaica:kingston Qatar:doha Oman:muscat Cyprus:nicosia Malta:valletta Albania:tirana"""
_PLURALS = """mouse:mice child:children foot:feet tooth:teeth man:men woman:women goose:geese
person:people|persons leaf:leaves knife:knives wolf:wolves box:boxes baby:babies city:cities
ox:oxen bus:buses|busses potato:potatoes hero:heroes
wife:wives half:halves life:lives glass:glasses church:churches dish:dishes story:stories
berry:berries cactus:cacti|cactuses cat:cats dog:dogs car:cars book:books tree:trees house:houses
apple:apples chair:chairs table:tables bird:birds horse:horses cow:cows egg:eggs hand:hands
girl:girls boy:boys day:days key:keys toy:toys fox:foxes watch:watches brush:brushes bench:benches
lady:ladies party:parties country:countries family:families fly:flies cherry:cherries
loaf:loaves thief:thieves shelf:shelves calf:calves elf:elves tomato:tomatoes echo:echoes
louse:lice die:dice crisis:crises analysis:analyses fungus:fungi|funguses nucleus:nuclei
radius:radii stimulus:stimuli index:indices|indexes appendix:appendices|appendixes
phenomenon:phenomena criterion:criteria bacterium:bacteria medium:media|mediums
bag:bags ball:balls bed:beds bell:bells boat:boats bottle:bottles bowl:bowls bridge:bridges
brick:bricks button:buttons candle:candles coat:coats cup:cups desk:desks door:doors drum:drums
flower:flowers frog:frogs garden:gardens hat:hats hill:hills lamp:lamps letter:letters map:maps
pen:pens pencil:pencils plate:plates ring:rings river:rivers road:roads rock:rocks shoe:shoes
shirt:shirts ship:ships sock:socks spoon:spoons star:stars stone:stones train:trains window:windows
bush:bushes class:classes dress:dresses kiss:kisses match:matches peach:peaches beach:beaches
torch:torches wish:wishes tax:taxes fairy:fairies puppy:puppies pony:ponies library:libraries
lily:lilies diary:diaries army:armies enemy:enemies scarf:scarves|scarfs hoof:hooves|hoofs"""
_LANGUAGES = """France:french Germany:german Spain:spanish Italy:italian Japan:japanese China:chinese|mandarin
Russia:russian Portugal:portuguese Brazil:portuguese Greece:greek Poland:polish the-Netherlands:dutch
Sweden:swedish Norway:norwegian Finland:finnish Denmark:danish Turkey:turkish South-Korea:korean
Vietnam:vietnamese Thailand:thai Egypt:arabic Mexico:spanish Argentina:spanish Hungary:hungarian
Iran:persian|farsi Israel:hebrew England:english Ukraine:ukrainian Czechia:czech Romania:romanian
Iceland:icelandic Austria:german Colombia:spanish Peru:spanish Chile:spanish Cuba:spanish
the-United-States:english Australia:english Bulgaria:bulgarian Serbia:serbian Croatia:croatian
Indonesia:indonesian Cambodia:khmer Mongolia:mongolian Estonia:estonian Latvia:latvian Lithuania:lithuanian"""

_FAMILIES = {  # family: (question template, table)
    "opposite": ("What is the opposite of {}?", _OPPOSITES),
    "capital": ("What is the capital of {}?", _CAPITALS),
    "plural": ("What is the plural of {}?", _PLURALS),
    "language": ("What language is spoken in {}?", _LANGUAGES),
}


def _rows(table: str) -> Iterable[tuple[str, list[str]]]:
    for item in table.split():
        key, answers = item.split(":")
        yield key.replace("-", " "), answers.split("|")


def _build() -> tuple[dict[str, Any], ...]:
    tasks: list[dict[str, Any]] = []
    for family, (template, table) in _FAMILIES.items():
        for key, answers in _rows(table):
            tasks.append({"question": template.format(key), "answers": answers, "category": family})
    questions = [t["question"] for t in tasks]
    assert len(questions) == len(set(questions)), "duplicate demo question"
    assert not {q for q, _ in EXAMPLES} & set(questions), "a worked example is also a task"
    return tuple(tasks)


TASKS: tuple[dict[str, Any], ...] = _build()


def _digest(question: str) -> str:
    return hashlib.sha256(question.encode()).hexdigest()


def _roles() -> dict[str, str]:
    """Within each family, order the questions by a hash; of every HELDOUT_EVERY, the first is
    held out for the gate, the second for the final test, the rest are for training. Stable
    across runs, machines and Python's hash seed; every family is in every part."""
    role: dict[str, str] = {}
    for family in sorted({t["category"] for t in TASKS}):
        ranked = sorted((t["question"] for t in TASKS if t["category"] == family), key=_digest)
        for i, question in enumerate(ranked):
            role[question] = {0: "heldout", 1: "test"}.get(i % HELDOUT_EVERY, "train")
    return role


_ROLE = _roles()


def is_heldout(question: str) -> bool:
    return _ROLE.get(question) == "heldout"


def train_tasks() -> list[dict[str, Any]]:
    """Asked by the demo's traffic, scored and reported: what the learner trains on."""
    return [t for t in TASKS if _ROLE[t["question"]] == "train"]


def heldout_tasks() -> list[dict[str, Any]]:
    """The gate's tasks: never asked by traffic."""
    return [t for t in TASKS if _ROLE[t["question"]] == "heldout"]


def test_tasks() -> list[dict[str, Any]]:
    """Asked only of the starting and the final release, never reported, never seen by the gate:
    a held-out measurement that nothing was selected on."""
    return [t for t in TASKS if _ROLE[t["question"]] == "test"]


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
    return {
        "messages": messages(task, examples),
        "answers": list(task["answers"]),
        "question": task["question"],
        "category": task["category"],
    }


def write_heldout_jsonl(path: Path, examples: int = SHOWN_EXAMPLES) -> Path:
    """The held-out tasks, one JSON object a line, in the form the gate reads."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(heldout_record(t, examples)) + "\n" for t in heldout_tasks()))
    return path


def read_tasks_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
