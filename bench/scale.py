"""Requests a second with 1, 2 and 4 front-end processes, all in front of the same fast upstream.

Starts a throwaway PostgreSQL cluster (tests/pg.py's binaries; the front ends share records,
reports and the commit log there, learning off) and the fast local upstream
(tests/scripted_upstream.py), then measures, plain and streaming, with bench/proxy.py's closed-loop
aiohttp client (the same requests, `--clients` concurrent):

- `processes N`: N separate `reef serve` processes on N ports (as behind a load balancer; the
  client spreads its connections over them round-robin);
- `--workers N`: one `reef serve --workers N` on one port, on PostgreSQL, then on one state
  directory (SQLite and JSONL logs shared by the workers, no database), against one process on
  a state directory measured in the same run.

The baseline is one process, measured in the same run; each row gives its requests a second, the
ratio to the baseline and the gain per added process ((ratio - 1) / (N - 1)). The load client,
the upstream and PostgreSQL run on the same machine and take their share of its cores, so the
ratio is bounded by the cores. Writes JSON. Run on its own (not in CI):

    .venv/bin/python bench/scale.py [--seconds 3] [--clients 64] [--counts 1 2 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proxy import one_request, start_upstream  # noqa: E402
from tests import pg  # noqa: E402
from tests.helpers.reef_server import ReefServer, free_port  # noqa: E402


async def load_many(urls: list[str], clients: int, seconds: float, stream: bool) -> dict[str, float]:
    """bench/proxy.py's closed loop over several front ends: client i sends to urls[i % len(urls)]."""
    latencies: list[float] = []
    errors = 0
    per_url = max(1, clients // len(urls) + 1)
    sessions = [
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=per_url), timeout=aiohttp.ClientTimeout(total=60))
        for _ in urls
    ]
    try:
        await asyncio.gather(
            *(one_request(sessions[i % len(urls)], urls[i % len(urls)], stream) for i in range(max(8, len(urls))))
        )  # warm up every front end
        stop = time.perf_counter() + seconds

        async def worker(i: int) -> None:
            nonlocal errors
            session, url = sessions[i % len(urls)], urls[i % len(urls)]
            while time.perf_counter() < stop:
                try:
                    latencies.append(await one_request(session, url, stream))
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(clients)))
        elapsed = time.perf_counter() - started
    finally:
        for session in sessions:
            await session.close()
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


class Cluster:
    def __init__(self) -> None:
        reason = pg._missing()
        if reason is not None:
            raise SystemExit(f"bench/scale.py needs PostgreSQL: {reason}")
        self.root = pg._make_root()
        self.data = self.root / "data"
        pg.init_cluster(self.data)
        self.server, dsn = pg._start(self.root, self.data)
        self.port = int(dict(p.split("=", 1) for p in dsn.split())["port"])
        self.dsn = dsn

    def database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        pg._stop(self.server, self.data)
        shutil.rmtree(self.root, ignore_errors=True)


def settings(store: str, upstream_url: str, remote: Path) -> dict[str, Any]:
    return {
        "store": store,
        "artifacts": {"remote": str(remote)},
        "learner": {"enabled": False},
        "upstream": {"url": upstream_url, "model": "echo"},
        "log_level": "error",
    }


def start_workers(workdir: Path, config: dict[str, Any], workers: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    path = workdir / "workers.yaml"
    path.write_text(yaml.safe_dump({**config, "port": port, "state_dir": str(workdir / "state")}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (workdir / "workers.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "reef", "serve", "-c", str(path), "--workers", str(workers)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    seen: set[str] = set()
    while len(seen) < workers:  # every worker up: new connections until each has answered
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"reef serve --workers {workers} did not start:\n{(workdir / 'workers.log').read_text()}"
            )
        try:
            seen.add(httpx.get(f"{url}/reef/status", timeout=2).json()["learning"]["front_end"])
        except (httpx.HTTPError, KeyError, ValueError):
            time.sleep(0.2)
    return process, url


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each measurement")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4], help="front-end processes")
    parser.add_argument("--out", type=Path, default=Path("bench/results/scale.json"))
    args = parser.parse_args()
    cluster = Cluster()
    upstream, upstream_url = start_upstream()
    workdir = Path(tempfile.mkdtemp(prefix="reef-bench-scale-"))
    rows: list[dict[str, Any]] = []
    baseline: dict[tuple[str, bool], float] = {}  # one process, per store

    def measure(setup: str, n: int, urls: list[str], store: str = "postgresql") -> None:
        for stream in (False, True):
            result = asyncio.run(
                load_many([f"{u}/v1/chat/completions" for u in urls], args.clients, args.seconds, stream)
            )
            if n == 1 and setup == "processes":
                baseline[(store, stream)] = result["rps"]
            base = baseline.get((store, stream))
            ratio = result["rps"] / base if base else float("nan")
            row = {
                "setup": setup,
                "store": store,
                "processes": n,
                "stream": stream,
                **result,
                "ratio_to_1": ratio,
                "gain_per_added_process": (ratio - 1) / (n - 1) if n > 1 else None,
            }
            rows.append(row)
            gain = f"{row['gain_per_added_process']:+.2f}" if n > 1 else "-"
            print(
                f"{setup:>9} {store:>10} {n:>2} {str(stream):>6} | {result['rps']:>7.0f} {result['median_ms']:>7.2f} "
                f"{result['p99_ms']:>7.1f} {result['errors']:>5} | {ratio:>5.2f} {gain:>6}",
                flush=True,
            )

    try:
        print(
            f"{os.cpu_count()} CPUs; {args.clients} clients, {args.seconds} s a point; "
            "rps = requests a second, med/p99 in ms; ratio = rps / rps of 1 process; gain = (ratio - 1) / (N - 1)"
        )
        print(
            f"{'setup':>9} {'store':>10} {'N':>2} {'stream':>6} | {'rps':>7} {'med':>7} {'p99':>7} {'errs':>5} | {'ratio':>5} "
            f"{'gain':>6}"
        )
        for n in args.counts:
            remote = workdir / f"p{n}-remote.git"
            subprocess.run(["git", "init", "--bare", "--quiet", str(remote)], check=True)
            config = settings(cluster.database(f"scale_p{n}"), upstream_url, remote)
            servers = [ReefServer(workdir / f"p{n}-{i}", config) for i in range(n)]
            try:
                for server in servers:
                    server.start()
                measure("processes", n, [s.url for s in servers])
            finally:
                for server in servers:
                    server.stop()
        for n in [c for c in args.counts if c > 1]:
            wdir = workdir / f"w{n}"
            wdir.mkdir()
            config = settings(cluster.database(f"scale_w{n}"), upstream_url, wdir / "remote.git")
            del config["artifacts"]
            process, url = start_workers(wdir, config, n)
            try:
                measure("--workers", n, [url])
            finally:
                stop(process)
        local = {
            "learner": {"enabled": False},
            "upstream": {"url": upstream_url, "model": "echo"},
            "log_level": "error",
        }
        single = ReefServer(workdir / "s1", local)  # one state directory: SQLite + JSONL, no database
        try:
            single.start()
            measure("processes", 1, [single.url], store="sqlite")
        finally:
            single.stop()
        for n in [c for c in args.counts if c > 1]:
            wdir = workdir / f"s{n}"
            wdir.mkdir()
            process, url = start_workers(wdir, local, n)
            try:
                measure("--workers", n, [url], store="sqlite")
            finally:
                stop(process)
    finally:
        upstream.kill()
        cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "scale",
                "seconds": args.seconds,
                "clients": args.clients,
                "machine": platform.node(),
                "cpus": os.cpu_count(),
                "results": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
