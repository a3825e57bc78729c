"""Reef beside a peer proxy (LiteLLM), both in front of the same fast upstream.

Starts a fast local upstream (`tests/scripted_upstream.py`, a real HTTP server answering
"echo: <text>"), `reef serve` in front of it (recording every exchange durably, as shipped), and
the LiteLLM proxy in front of the same upstream (one worker, logging off; installed from PyPI into
the benchmark's own environment `bench/.litellm-venv` on first use), each in its own process.
Then, for each number of concurrent clients, streaming and not, the same chat-completion
requests go to the upstream directly (the baseline, the limit), through Reef and through
LiteLLM, from an aiohttp load client in this process. Prints requests per second, median and
p99 latency, the latency each proxy adds over direct and Reef's ratios to LiteLLM, and writes
JSON. Run on its own (not in CI):

    .venv/bin/python bench/proxy.py [--seconds 5] [--clients 1 8 32 128] [--no-litellm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.reef_server import ReefServer, free_port  # noqa: E402

LITELLM_VERSION = "1.108.7"
LITELLM_ENV = ROOT / "bench" / ".litellm-venv"
MODEL = "bench"  # the name LiteLLM routes; Reef and the upstream answer any name
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say something short about the sea."}],
    "max_tokens": 32,
}


async def one_request(client: aiohttp.ClientSession, url: str, stream: bool) -> float:
    started = time.perf_counter()
    async with client.post(url, json={**BODY, "stream": True} if stream else BODY) as response:
        response.raise_for_status()
        async for _ in response.content.iter_any():
            pass
    return time.perf_counter() - started


async def load(url: str, clients: int, seconds: float, stream: bool) -> dict[str, float]:
    """Closed loop: `clients` workers, each sending its next request when the last one ends."""
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as client:
        await asyncio.gather(*(one_request(client, url, stream) for _ in range(min(clients, 8))))  # warm up
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                try:
                    latencies.append(await one_request(client, url, stream))
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    if not latencies:
        return {"requests": 0, "errors": errors, "rps": 0.0, "median_ms": float("nan"), "p99_ms": float("nan")}
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "median_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    }


def wait_until_answering(url: str, process: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            httpx.post(f"{url}/chat/completions", json=BODY, timeout=2).raise_for_status()
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer within {timeout} s")


def start_upstream() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.scripted_upstream", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_answering(url, process, "the benchmark upstream", timeout=20)
    except RuntimeError:
        process.kill()
        raise
    return process, url


def ensure_litellm() -> Path:
    """The LiteLLM proxy in its own virtual environment (it pins many packages of its own)."""
    exe = LITELLM_ENV / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_ENV} (once; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM_ENV)], check=True)
    subprocess.run(
        [str(LITELLM_ENV / "bin" / "pip"), "install", "--quiet", f"litellm[proxy]=={LITELLM_VERSION}"], check=True
    )
    return exe


def start_litellm(upstream_url: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    exe = ensure_litellm()
    config = workdir / "litellm.yaml"
    config.write_text(
        json.dumps(
            {  # JSON is YAML
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {"model": "openai/echo", "api_base": upstream_url, "api_key": "sk-bench"},
                    }
                ],
                "litellm_settings": {"turn_off_message_logging": True, "set_verbose": False},
            }
        )
    )
    port = free_port()
    env = {
        **os.environ,
        "LITELLM_LOG": "ERROR",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    }  # a loopback benchmark
    process = subprocess.Popen(
        [str(exe), "--config", str(config), "--port", str(port), "--num_workers", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=workdir,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_answering(url, process, "the LiteLLM proxy")
    except RuntimeError:
        process.kill()
        raise
    return process, url


def row_of(clients: int, stream: bool, direct: dict, reef: dict, litellm: dict | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "clients": clients,
        "stream": stream,
        "direct": direct,
        "reef": reef,
        "reef_added_median_ms": reef["median_ms"] - direct["median_ms"],
        "reef_rps_ratio_to_direct": reef["rps"] / direct["rps"],
    }
    if litellm is not None:
        row["litellm"] = litellm
        row["litellm_added_median_ms"] = litellm["median_ms"] - direct["median_ms"]
        row["reef_rps_over_litellm"] = reef["rps"] / litellm["rps"] if litellm["rps"] else float("inf")
        row["reef_added_over_litellm_added"] = row["reef_added_median_ms"] / row["litellm_added_median_ms"]
    return row


HEADER = (
    f"{'clients':>7} {'stream':>6} | {'direct':>7} {'med':>6} | {'reef':>6} {'med':>6} {'p99':>6} {'added':>6} | "
    f"{'litellm':>7} {'med':>6} {'p99':>6} {'added':>6} | {'rps x':>6} {'added x':>7}"
)


def print_row(row: dict[str, Any]) -> None:
    d, r, lite = row["direct"], row["reef"], row.get("litellm")
    line = (
        f"{row['clients']:>7} {str(row['stream']):>6} | {d['rps']:>7.0f} {d['median_ms']:>6.2f} | "
        f"{r['rps']:>6.0f} {r['median_ms']:>6.2f} {r['p99_ms']:>6.1f} {row['reef_added_median_ms']:>6.2f} | "
    )
    if lite is not None:
        line += (
            f"{lite['rps']:>7.0f} {lite['median_ms']:>6.1f} {lite['p99_ms']:>6.1f} "
            f"{row['litellm_added_median_ms']:>6.1f} | {row['reef_rps_over_litellm']:>6.1f} "
            f"{row['reef_added_over_litellm_added']:>7.3f}"
        )
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--no-litellm", action="store_true", help="measure direct and Reef only")
    parser.add_argument("--out", type=Path, default=Path("bench/results/proxy.json"))
    args = parser.parse_args()
    upstream, upstream_url = start_upstream()
    workdir = Path(tempfile.mkdtemp(prefix="reef-bench-proxy-"))
    litellm = None
    rows = []
    try:
        litellm_url = None
        if not args.no_litellm:
            litellm, litellm_url = start_litellm(upstream_url, workdir)
        settings = {"upstream": {"url": upstream_url, "model": "echo"}, "log_level": "error"}
        with ReefServer(workdir, settings) as reef:
            print(
                "rps = requests per second; med, p99, added = latency in ms; rps x = Reef rps / LiteLLM rps; "
                "added x = Reef's added median / LiteLLM's"
            )
            print(HEADER)
            for stream in (False, True):
                for clients in args.clients:
                    direct = asyncio.run(load(f"{upstream_url}/chat/completions", clients, args.seconds, stream))
                    proxied = asyncio.run(load(f"{reef.base_url}/chat/completions", clients, args.seconds, stream))
                    peer = (
                        asyncio.run(load(f"{litellm_url}/chat/completions", clients, args.seconds, stream))
                        if litellm_url
                        else None
                    )
                    row = row_of(clients, stream, direct, proxied, peer)
                    rows.append(row)
                    print_row(row)
    finally:
        upstream.kill()
        if litellm is not None:
            litellm.kill()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "proxy",
                "seconds": args.seconds,
                "machine": platform.node(),
                "cpus": os.cpu_count(),
                "litellm": None if args.no_litellm else LITELLM_VERSION,
                "results": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
