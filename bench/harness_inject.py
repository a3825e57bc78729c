"""What inject mode costs a request: `HarnessInjector.inject` per call, in microseconds.

Baseline in the same process: the same call for a release without a harness (what every
request of a weights-only or empty scenario pays). Then a small harness (a system prompt, 3
rules, 2 skills) and a large one (20 rules, 40 skills), each for a short request and for a long
agent conversation (~100 KB of user and assistant text) that mentions one skill. Writes
bench/results/harness_inject.json. Run on its own:

    .venv/bin/python bench/harness_inject.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reef.commit.artifacts import ArtifactStore, content_id_of  # noqa: E402
from reef.config import HarnessConfig  # noqa: E402
from reef.core.chat import ChatRequest, Message  # noqa: E402
from reef.core.types import ReleaseRef  # noqa: E402
from reef.surfaces.harness import HarnessTree, Skill  # noqa: E402
from reef.surfaces.inject import HarnessInjector  # noqa: E402


def tree(rules: int, skills: int) -> HarnessTree:
    return HarnessTree(
        system="You are a careful coding agent. " * 10,
        rules={f"rule-{i}": f"Rule number {i}: always check case {i} before answering. " * 3 for i in range(rules)},
        skills={
            f"topic{i}-guide": Skill(f"topic{i}-guide", f"How to handle situation {i}", f"Step by step {i}. " * 40)
            for i in range(skills)
        },
    )


def request(chars: int) -> ChatRequest:
    turns = max(1, chars // 1000)
    messages = [
        Message("user" if i % 2 == 0 else "assistant", ("lorem ipsum dolor sit amet " * 37)[:1000])
        for i in range(turns)
    ]
    messages.append(Message("user", "follow the topic1 guide for this"))
    return ChatRequest(model="m", messages=tuple(messages), dialect="openai")


async def per_call_us(injector: HarnessInjector, ref: ReleaseRef, chat: ChatRequest, calls: int) -> float:
    for _ in range(100):
        await injector.inject("s", chat, ref)
    started = time.perf_counter()
    for _ in range(calls):
        await injector.inject("s", chat, ref)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "harness_inject.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reef-bench-harness-") as work:
        injector = HarnessInjector(HarnessConfig(), ArtifactStore(Path(work) / "a.git"))
        refs = {}
        for name, files in (("none", {}), ("small", tree(3, 2).to_files()), ("large", tree(20, 40).to_files())):
            ref = ReleaseRef(f"r-{name}", content_id_of(files), "load")
            injector.remember(ref.content_id, files)
            refs[name] = ref
        results = {}
        for size, chat in (("short", request(0)), ("long", request(100_000))):
            base = asyncio.run(per_call_us(injector, refs["none"], chat, args.calls))
            results[f"none/{size}"] = {"us_per_call": round(base, 2), "ratio": 1.0}
            for name in ("small", "large"):
                us = asyncio.run(per_call_us(injector, refs[name], chat, args.calls // 4))
                results[f"{name}/{size}"] = {"us_per_call": round(us, 2), "ratio": round(us / base, 1)}
    for key, row in results.items():
        print(f"{key:<12} {row['us_per_call']:>9.2f} us/call  x{row['ratio']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"python": platform.python_version(), "calls": args.calls, "results": results}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
