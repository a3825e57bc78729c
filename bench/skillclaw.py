"""SkillClaw's nights on a drifting task stream: the pool and the score against the frozen control.

A real `reef serve` with one scenario bound to `skillclaw`, in front of a scripted model on the
upstream runtime (the CPU-sized stand-in for a hosted model): it meets a demand of the day only
when its system prompt says so (a skill whose description names the demand), and fails at
random `--noise` of the time anyway. What users demand drifts, so the pool must grow and shrink:
days 1-3 want one-word answers, days 4-6 one-word answers in lower case, from day 7 only lower
case (the one-word skill's theme is gone and should be pruned). Each answer is scored 1 when it
meets every demand of the day, else 0 with the feedback a user would give for the first one
missed. `--per-day` questions a day, each a new conversation.

Prints one row per night (the comparison of the day's treatment arm against the control, the
pool after the night) and the served score of each day by arm. Run on its own, not in CI:

    .venv/bin/python bench/skillclaw.py [--days 9] [--per-day 64] [--noise 0.1] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from reef.client import ReefClient  # noqa: E402
from tests.helpers.reef_server import ReefServer  # noqa: E402
from tests.scripted_upstream import ScriptedUpstream  # noqa: E402

DEMANDS = {  # demand -> (marker the model obeys in its system prompt, feedback when missed)
    "one_word": ("single word", "Answer with a single word only."),
    "lower": ("lower case", "Write the answer in lower case only."),
}


def demands_of(day: int) -> list[str]:
    return ["one_word"] if day <= 3 else ["one_word", "lower"] if day <= 6 else ["lower"]


class Model:
    """The scripted model: meets each demand its system prompt names, unless noise strikes."""

    def __init__(self, noise: float, seed: int) -> None:
        self.noise = noise
        self.random = random.Random(seed)

    def answer(self, body: dict[str, Any]) -> str:
        system = " ".join(m["content"] for m in body["messages"] if m["role"] == "system").lower()
        one_word = DEMANDS["one_word"][0] in system and self.random.random() >= self.noise
        lower = DEMANDS["lower"][0] in system and self.random.random() >= self.noise
        text = "Paris" if one_word else "The capital of France is Paris."
        return text.lower() if lower else text


def score(answer: str, day: int) -> tuple[float, str | None]:
    for demand in demands_of(day):
        met = len(answer.split()) == 1 if demand == "one_word" else answer == answer.lower()
        if not met:
            return 0.0, DEMANDS[demand][1]
    return 1.0, None


def gate_score(task: dict[str, Any], text: str) -> float:
    """The gate's scorer (by dotted path): the same score, on the day its held-out question was asked."""
    question = next(m["content"] for m in task["messages"] if m["role"] == "user")
    return score(text, int(question.split(",")[0].removeprefix("Day ")))[0]


def run_day(reef: ReefServer, day: int, per_day: int) -> dict[str, list[float]]:
    by_arm: dict[str, list[float]] = {}
    with ReefClient(reef.url) as client, httpx.Client(timeout=30) as http:
        for i in range(per_day):
            question = f"Day {day}, question {i}: what is the capital of France?"
            response = http.post(
                f"{reef.base_url}/chat/completions",
                json={"model": "any", "messages": [{"role": "user", "content": question}]},
                headers={"x-reef-scenario": "stream"},
            )
            response.raise_for_status()
            receipt = response.headers["x-reef-agent-record-id"]
            value, feedback = score(response.json()["choices"][0]["message"]["content"], day)
            client.report(receipt, score=value, feedback=feedback)
            arm = (client.record(receipt)["record"].get("harness") or {}).get("arm", "none")
            by_arm.setdefault(arm, []).append(value)
    return by_arm


def nights(reef: ReefServer) -> list[dict[str, Any]]:
    with ReefClient(reef.url) as client:
        learner = next(s for s in client.status()["learning"]["learners"] if s["scenario"] == "stream")
    return learner.get("nights") or []


def wait_for_night(reef: ReefServer, after: int, timeout: float = 60.0) -> dict[str, Any] | None:
    """The first night after night `after`, once it has come (None: the day brought none)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = nights(reef)
        if done and done[-1]["night"] > after:
            return done[-1]
        time.sleep(0.2)
    return None


def settings(model: ScriptedUpstream, per_day: int) -> dict[str, Any]:
    return {
        "upstream": {"url": model.base_url, "model": "scripted"},
        "recipes": {"scenarios": {"stream": "skillclaw"}},
        "learner": {
            "poll_interval": 0.05,
            "skillclaw": {"night_records": per_day, "gate": {"scorer": "bench.skillclaw:gate_score"}},
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=9)
    parser.add_argument("--per-day", type=int, default=64)
    parser.add_argument("--noise", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = Model(args.noise, args.seed)
    print("day  demands          treatment  control  | night: comparison                      pool  changes")
    with ScriptedUpstream() as upstream, tempfile.TemporaryDirectory() as tmp:
        upstream.answer_with(model.answer)
        with ReefServer(Path(tmp), settings(upstream, args.per_day)) as reef:
            last = 0
            for day in range(1, args.days + 1):
                arms = run_day(reef, day, args.per_day)
                night = wait_for_night(reef, last)
                last = night["night"] if night else last
                print(row(day, arms, night), flush=True)
    return 0


def row(day: int, arms: dict[str, list[float]], night: dict[str, Any] | None) -> str:
    def mean(arm: str) -> str:
        values = arms.get(arm) or []
        return f"{sum(values) / len(values):.2f} ({len(values):2d})" if values else "   -     "

    treatment = mean("treatment") if "treatment" in arms else mean("none")
    head = f"{day:3d}  {'+'.join(demands_of(day)):15s}  {treatment}  {mean('control')}  |"
    if night is None:
        return head + " no night (too few reports of an arm)"
    c = night["comparison"]
    comparison = f"{c['verdict']:13s}" + (f" gain {c['gain']:+.2f} se {c['se']:.2f}" if "gain" in c else "")
    changes = {k: night[k] for k in ("added", "rewritten", "merged", "pruned") if night.get(k)}
    return f"{head} {night['night']:2d}: {comparison:32s}  {night['pool']:4d}  {changes}"


if __name__ == "__main__":
    raise SystemExit(main())
