"""Does `openclaw_rl` learn without reports? A scripted multi-turn user, a judge over HTTP, SmolLM2.

A real `reef serve` on the embedded model (SmolLM2-135M-Instruct, its default runtime) with its
one scenario bound to `openclaw_rl`; nobody ever calls `/reef/report`. Scripted users (real
HTTP clients, `--concurrency` at once) hold conversations over the demo's training questions
(reef.demo.tasks, asked with its one worked example): after a wrong answer the user says
"That's wrong, try again." and asks again (up to `--tries` times; after the last, "That's wrong.
Never mind." and the next question), after a right one it says "Right." and asks the next
question, in the same conversation; half of the conversations send
`x-reef-session`, the other half are stitched by their message prefixes. The judge is a real
HTTP server (tests/scripted_upstream.py) that reads the fenced next state and votes -1 when it
says "wrong", else +1: a stand-in for a model judge whose verdicts are reproducible. The gate
asks the demo's 92 held-out questions (reef.demo.tasks:gate_score).

Printed and written to bench/results/openclaw_rl.json: test success (greedy exact answers on
the demo's 91 test questions, never asked by the users, never trained or selected on) of the
starting and the final release, releases published and rejected, turns trained, and the judge
calls spent. Run on its own, on an otherwise idle machine (at most `--minutes` of traffic, plus
the start, two passes over the test questions and at most `--settle-minutes` for the last verdict):

    .venv/bin/python bench/openclaw_rl.py [--minutes 15] [--concurrency 4] [--out bench/results/openclaw_rl.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx  # noqa: E402
import yaml  # noqa: E402

from reef.demo import tasks as demo_tasks  # noqa: E402
from reef.demo.run import HEADERS, SCENARIO, measure_test  # noqa: E402
from reef.demo.server import GATE_MAX_TOKENS, DemoServer, free_port  # noqa: E402
from tests.scripted_upstream import ScriptedUpstream  # noqa: E402

MAX_TOKENS = 16
QUESTIONS_PER_CONVERSATION = 3


def judge(body: dict[str, Any]) -> str:
    """The scripted judge: -1 when the fenced next state says "wrong", else +1."""
    prompt = body["messages"][-1]["content"]
    next_state = prompt.split('label="next state">', 1)[-1].lower()
    return "VERDICT: -1" if "wrong" in next_state else "VERDICT: +1"


def settings(
    workdir: Path, heldout: Path, port: int, judge_url: str, model_dir: Path | None, args: argparse.Namespace
) -> dict[str, Any]:
    embedded: dict[str, Any] = {"default_max_tokens": MAX_TOKENS}
    if model_dir is not None:
        embedded["model_dir"] = str(model_dir.resolve())
    return {
        "host": "127.0.0.1",
        "port": port,
        "state_dir": str((workdir / "state").resolve()),
        "runtime": "embedded",
        "log_level": "warning",
        "embedded": embedded,
        "recipes": {"default": "openclaw_rl"},
        "learner": {
            "openclaw_rl": {  # the recipe's defaults, but for what the command line changes
                **recipe_overrides(args, judge_url),
            },
            "gate": {
                "tasks": str(heldout.resolve()),
                "scorer": "reef.demo.tasks:gate_score",
                "max_tokens": GATE_MAX_TOKENS,
                "temperature": 0,
            },
        },
    }


def recipe_overrides(args: argparse.Namespace, judge_url: str) -> dict[str, Any]:
    """What the command line changes of the recipe's defaults (nothing, by default, but the judge)."""
    tuned = {"turns_per_batch": args.turns_per_batch, "steps_per_candidate": args.steps_per_candidate, "lr": args.lr}
    judge = {} if args.own_judge else {"url": judge_url, "model": "scripted-judge"}
    if args.votes is not None:
        judge["votes"] = args.votes
    return {
        **{k: v for k, v in tuned.items() if v is not None},
        **({"judge": judge} if judge else {}),
        **({"hints": {"enabled": True}} if args.hints else {}),
    }


class Tally:
    def __init__(self) -> None:
        self.turns = 0
        self.right_first = 0
        self.questions = 0
        self.conversations = 0


async def conversation(
    client: httpx.AsyncClient, who: str, asked: list[dict[str, Any]], tries: int, named: bool, tally: Tally
) -> None:
    """One scripted user: each question until right (or `tries` answers), then the next."""
    headers = {**HEADERS, **({"x-reef-session": who} if named else {})}
    messages = demo_tasks.messages(asked[0])
    for index, task in enumerate(asked):
        tally.questions += 1
        for attempt in range(tries):
            body = {"model": "smollm2", "messages": messages, "temperature": 1.0, "max_tokens": MAX_TOKENS}
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
            response.raise_for_status()
            choice = response.json()["choices"][0]
            text = choice["message"].get("content") or ""
            tally.turns += 1
            right = demo_tasks.success(task, text, choice.get("finish_reason") or "")
            tally.right_first += right and attempt == 0
            messages = [*messages, {"role": "assistant", "content": text}]
            if right or attempt == tries - 1:
                following = asked[index + 1] if index + 1 < len(asked) else None
                # a user who gives up still says the answer was wrong: the judge reads what a model
                # judge would ("Never mind." alone was voted +1, so every last wrong try was rewarded)
                said = "Right." if right else "That's wrong. Never mind."
                ask = f" Next: {demo_tasks.user_prompt(following)}" if following else " Thanks, bye."
                messages = [*messages, {"role": "user", "content": said + ask}]
                break
            messages = [
                *messages,
                {"role": "user", "content": f"That's wrong, try again. {demo_tasks.user_prompt(task)}"},
            ]
    # the closing message is the last answer's next state: one more request carries it
    body = {"model": "smollm2", "messages": messages, "temperature": 1.0, "max_tokens": 4}
    (await client.post("/v1/chat/completions", json=body, headers=headers)).raise_for_status()
    tally.conversations += 1


async def users(url: str, minutes: float, concurrency: int, tries: int, seed: int, tally: Tally) -> None:
    train = demo_tasks.train_tasks()
    rng = random.Random(seed)
    deadline = time.monotonic() + minutes * 60
    counter = itertools.count()

    async def one_user(client: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            n = next(counter)
            await conversation(
                client, f"user-{n}", rng.sample(train, QUESTIONS_PER_CONVERSATION), tries, named=n % 2 == 0, tally=tally
            )

    async with httpx.AsyncClient(base_url=url, timeout=300.0) as client:
        await asyncio.gather(*(one_user(client) for _ in range(concurrency)))


def learner_status(url: str) -> dict[str, Any]:
    status = httpx.get(f"{url}/reef/status", timeout=30).json()
    return next((s for s in status["learning"]["learners"] if s["scenario"] == SCENARIO), {})


def decisions(url: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/reef/scenarios/{SCENARIO}/decisions", timeout=30)
    return response.json()["decisions"] if response.status_code == 200 else []


def settle(url: str, minutes: float) -> None:
    """After the users stop: wait (at most `minutes`) for the candidate in training or at the gate."""
    deadline = time.monotonic() + minutes * 60
    while time.monotonic() < deadline and learner_status(url).get("state") in (
        "training",
        "evaluating",
        "logging batch",
    ):
        time.sleep(2)


async def test_success(url: str, concurrency: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=300.0) as client:
        return await measure_test(client, demo_tasks.SHOWN_EXAMPLES, concurrency)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="of user traffic (at most 15 for the issue's run)")
    parser.add_argument("--concurrency", type=int, default=4, help="scripted users at once")
    parser.add_argument("--tries", type=int, default=2, help="answers a user waits for before moving on")
    parser.add_argument("--votes", type=int, default=None, help="judge calls per turn (default: the recipe's)")
    parser.add_argument("--turns-per-batch", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--steps-per-candidate", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--lr", type=float, default=None, help="default: the recipe's")
    parser.add_argument(
        "--own-judge", action="store_true", help="the recipe's default judge, the scenario's own model (not scripted)"
    )
    parser.add_argument("--hints", action="store_true", help="hindsight hints on (the judge writes them)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--settle-minutes",
        type=float,
        default=5.0,
        help="after the users stop, wait this long at most for the candidate at the gate",
    )
    parser.add_argument("--model-dir", type=Path, default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "openclaw_rl.json")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="reef-bench-openclaw-") as work,
        ScriptedUpstream(record=False) as judge_server,
    ):
        calls = itertools.count()  # the judge calls it answered
        judge_server.answer_with(lambda body: (next(calls), judge(body))[1])
        workdir = Path(work)
        heldout = demo_tasks.write_heldout_jsonl(workdir / "heldout.jsonl")
        port = free_port()
        config = workdir / "serve.yaml"
        config.write_text(yaml.safe_dump(settings(workdir, heldout, port, judge_server.base_url, args.model_dir, args)))
        server = DemoServer(config, port, workdir / "serve.log")
        server.start()
        try:
            print(f"openclaw_rl bench: reef serve up after {time.monotonic() - started:.0f}s; test questions, start")
            start = asyncio.run(test_success(server.url, args.concurrency))
            print(f"  start release {start['release_id']}: test success {start['success']:.3f}")
            tally = Tally()
            traffic_began = time.time()
            asyncio.run(users(server.url, args.minutes, args.concurrency, args.tries, args.seed, tally))
            settle(server.url, args.settle_minutes)
            status, found = learner_status(server.url), decisions(server.url)
            final = asyncio.run(test_success(server.url, args.concurrency))
            judge_calls = next(calls)
        finally:
            log_tail = server.log_tail(40)
            server.stop()
    published = sum(d["verdict"]["decision"] == "select" for d in found)
    selected_at = [d["recorded_at"] for d in found if d["verdict"]["decision"] == "select" and "recorded_at" in d]
    first_minute = round((min(selected_at) - traffic_began) / 60, 1) if selected_at else None
    record = {
        "benchmark": "openclaw_rl",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "result": {
            "start_test_success": start["success"],
            "final_test_success": final["success"],
            "start_release_id": start["release_id"],
            "final_release_id": final["release_id"],
            "test_questions": final["n"],
            "published": published,
            "first_publication_minute": first_minute,
            "rejected": len(found) - published,
            "judge_calls": judge_calls,
            "turns_trained": status.get("turns_trained"),
            "conversations": tally.conversations,
            "questions_asked": tally.questions,
            "turns": tally.turns,
            "right_first_time": tally.right_first,
            "learner": status,
            "seconds": round(time.monotonic() - started, 1),
        },
        "decisions": [
            {
                "decision": d["verdict"]["decision"],
                "gate": d["verdict"].get("metrics", {}).get("candidate_score"),
                "turns": d.get("metrics", {}).get("turns"),
            }
            for d in found
        ],
    }
    if not found:
        record["server_log_tail"] = log_tail
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    r = record["result"]
    print(
        f"openclaw_rl bench ({args.minutes:g} min of users): test success {r['start_test_success']:.3f} -> "
        f"{r['final_test_success']:.3f} on {r['test_questions']} questions never trained on; "
        f"{published} published (the first at minute {first_minute}), {r['rejected']} rejected; "
        f"{r['turns_trained']} turns trained; "
        f"{judge_calls} judge calls; {r['conversations']} conversations, {r['turns']} turns; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
