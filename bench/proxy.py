"""Latency Reef adds over calling the same upstream directly, and requests per second.

Starts a fast local upstream (`tests/scripted_upstream.py`, answering "echo: <text>") and
`reef serve` in front of it (recording every exchange durably, as shipped), each in its own
process, then for 1, 8 and 32 concurrent clients, streaming and not, sends the same chat
completion requests to the upstream directly (the baseline) and through Reef. Prints median
and p99 latency, requests per second, the latency Reef adds and the throughput ratio, and
writes JSON. Run on its own (not in CI):

    .venv/bin/python bench/proxy.py [--seconds 5] [--out bench/results/proxy.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.reef_server import ReefServer, free_port  # noqa: E402

BODY = {"model": "bench", "messages": [{"role": "user", "content": "Say something short about the sea."}],
        "max_tokens": 32}


async def one_request(client: aiohttp.ClientSession, url: str, stream: bool) -> float:
    started = time.perf_counter()
    async with client.post(url, json={**BODY, "stream": True} if stream else BODY) as response:
        response.raise_for_status()
        async for _ in response.content.iter_any():
            pass
    return time.perf_counter() - started


async def load(url: str, clients: int, seconds: float, stream: bool) -> dict[str, float]:
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:
        for _ in range(min(clients, 4)):  # warm the connections
            await one_request(client, url, stream)
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < stop:
                latencies.append(await one_request(client, url, stream))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {"requests": len(latencies), "rps": len(latencies) / elapsed,
            "median_ms": statistics.median(latencies) * 1000,
            "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000}


def start_upstream() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "tests.scripted_upstream", "--port", str(port)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.post(f"{url}/chat/completions", json=BODY, timeout=1).raise_for_status()
            return process, url
        except httpx.HTTPError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the benchmark upstream did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--out", type=Path, default=Path("bench/results/proxy.json"))
    args = parser.parse_args()
    upstream, upstream_url = start_upstream()
    workdir = Path(tempfile.mkdtemp(prefix="reef-bench-proxy-"))
    settings = {"upstream": {"url": upstream_url, "model": "echo"}, "log_level": "error"}
    rows = []
    try:
        with ReefServer(workdir, settings) as reef:
            print(f"{'clients':>7} {'stream':>6} | {'direct rps':>10} {'med ms':>7} {'p99 ms':>7} | "
                  f"{'reef rps':>9} {'med ms':>7} {'p99 ms':>7} | {'added med':>9} {'added p99':>9} {'rps ratio':>9}")
            for stream in (False, True):
                for clients in args.clients:
                    direct = asyncio.run(load(f"{upstream_url}/chat/completions", clients, args.seconds, stream))
                    proxied = asyncio.run(load(f"{reef.base_url}/chat/completions", clients, args.seconds, stream))
                    row = {"clients": clients, "stream": stream, "direct": direct, "reef": proxied,
                           "added_median_ms": proxied["median_ms"] - direct["median_ms"],
                           "added_p99_ms": proxied["p99_ms"] - direct["p99_ms"],
                           "rps_ratio_to_direct": proxied["rps"] / direct["rps"]}
                    rows.append(row)
                    print(f"{clients:>7} {str(stream):>6} | {direct['rps']:>10.0f} {direct['median_ms']:>7.2f} "
                          f"{direct['p99_ms']:>7.2f} | {proxied['rps']:>9.0f} {proxied['median_ms']:>7.2f} "
                          f"{proxied['p99_ms']:>7.2f} | {row['added_median_ms']:>9.2f} {row['added_p99_ms']:>9.2f} "
                          f"{row['rps_ratio_to_direct']:>9.2f}")
    finally:
        upstream.kill()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "proxy", "seconds": args.seconds, "results": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
