"""The demo driver: serve, observe, grow, commit, on the embedded model, with a live view.

`run_demo` starts its own `reef serve` (reef.demo.server), then for `minutes` keeps
`concurrency` chat requests in flight (train-split questions at `temperature`, scenario `demo`),
scores every answer with the strict verifier (reef.demo.tasks), reports the score on its
receipt, and watches the learner's gate verdicts (`GET /reef/scenarios/demo/decisions`, or the
release chain where that route is missing). Before the traffic and after it, the test
questions (reef.demo.tasks.test_tasks) are asked of the serving release. At the end, or on
Ctrl-C, it stops the server and writes `learning_curve.png` and `learning_curve.json`
(reef.demo.curve) into `out_dir`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import yaml

from reef.demo import tasks as demo_tasks
from reef.demo.curve import curve_table, rolling_success, write_curve
from reef.demo.server import (
    CANARY,
    GATE_MAX_TOKENS,
    LEARNING_RATE,
    LOSS,
    TRAFFIC_MAX_TOKENS,
    TRAFFIC_TEMPERATURE,
    DemoServer,
    DemoServerError,
    demo_settings,
    free_port,
)

SCENARIO = "demo"
HEADERS = {"x-reef-scenario": SCENARIO}
POLL_SECONDS = 2.0
# A verdict of the gate under way when --minutes are up keeps the traffic going until it lands, at
# most this much longer: what the traffic trained is published (or rejected) while traffic runs.
# Without it a short demo's first publication came after its traffic had stopped, while the
# demo waited for that verdict with nothing to show.
VERDICT_GRACE_MINUTES = 4.0


@dataclass
class DemoResult:
    start_heldout_success: float | None
    best_heldout_success: float | None
    final_heldout_success: float | None
    improvement_points: float | None  # final minus start, in percentage points
    releases_published: int
    releases_rejected: int
    requests: int
    reports: int
    errors: int
    minutes: float
    live_success_first: float | None  # live traffic, first and last window of requests
    live_success_last: float | None
    start_test_success: float | None  # test questions (never reported, never judged by the gate)
    final_test_success: float | None
    final_test_release: str | None
    interrupted: bool
    png: str
    json: str
    server_log: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DemoStats:
    """Everything the demo has seen; the live view and the curve are drawn from it."""

    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    minutes: float = 15.0
    examples: int = demo_tasks.SHOWN_EXAMPLES
    temperature: float = TRAFFIC_TEMPERATURE
    lr: float = LEARNING_RATE
    runtime: str = "embedded"
    canary: float = CANARY
    loss: str = LOSS
    tasks: Any = demo_tasks  # what traffic asks and how it is scored (train_tasks, messages, score, feedback)
    max_tokens: int = TRAFFIC_MAX_TOKENS
    requests: int = 0
    in_flight: int = 0
    reports: int = 0
    errors: int = 0
    last_error: str = ""
    starting_release: str | None = None
    traffic: list[dict[str, Any]] = field(default_factory=list)
    per_release: dict[str, dict[str, float]] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    decisions_route: bool = True
    traffic_minutes: float | None = None  # when the traffic stopped (past --minutes while a verdict was under way)
    verdicts_at_minutes: int | None = None  # the gate's verdicts seen when --minutes were up
    learning: dict[str, Any] = field(default_factory=dict)
    test: dict[str, dict[str, Any]] = field(
        default_factory=dict
    )  # "start" / "final": {release_id, n, success[, minute]}

    def elapsed(self) -> float:
        return (time.monotonic() - self.started) / 60

    def traffic_goes_on(self) -> bool:
        """Within --minutes; after them, until the verdict the gate was reaching then has landed
        (a canary serves while it judges), within the grace."""
        elapsed = self.elapsed()
        if elapsed < self.minutes:
            return True
        if self.verdicts_at_minutes is None:
            self.verdicts_at_minutes = len(self.decisions)
        return (
            elapsed < self.minutes + VERDICT_GRACE_MINUTES
            and canary_running(self.learning)
            and len(self.decisions) == self.verdicts_at_minutes
        )

    def record(self, release_id: str, value: float, ok: bool) -> None:
        self.starting_release = self.starting_release or release_id
        self.traffic.append(
            {"minute": round(self.elapsed(), 4), "score": value, "success": ok, "release_id": release_id}
        )
        row = self.per_release.setdefault(release_id, {"requests": 0, "score_sum": 0.0, "successes": 0})
        row["requests"] += 1
        row["score_sum"] += value
        row["successes"] += int(ok)

    def heldout_points(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(held-out success of each serving release, rejected candidates) from the verdicts."""
        heldout: list[dict[str, Any]] = []
        rejected: list[dict[str, Any]] = []
        for d in sorted(self.decisions, key=lambda d: d.get("step") or 0):
            verdict = d.get("verdict") or {}
            m = verdict.get("metrics") or {}
            minute = max(0.0, (float(d.get("recorded_at") or self.started_wall) - self.started_wall) / 60)
            if not heldout and m.get("current_success") is not None:
                heldout.append(
                    {
                        "minute": 0.0,
                        "success": m["current_success"],
                        "score": m.get("current_score"),
                        "release_id": self.starting_release,
                        "kind": "start",
                    }
                )
            if (
                verdict.get("decision") == "select"
                and d.get("operation") == "training"
                and m.get("candidate_success") is not None
            ):
                heldout.append(
                    {
                        "minute": round(minute, 4),
                        "success": m["candidate_success"],
                        "score": m.get("candidate_score"),
                        "release_id": d.get("release_id"),
                        "kind": "published",
                    }
                )
            elif verdict.get("decision") == "reject" and m.get("candidate_success") is not None:
                rejected.append(
                    {
                        "minute": round(minute, 4),
                        "candidate_success": m["candidate_success"],
                        "current_success": m.get("current_success"),
                        "p_value": m.get("p_value"),
                    }
                )
        return heldout, rejected

    def counts(self) -> tuple[int, int]:
        published = sum(
            1
            for d in self.decisions
            if d.get("operation") == "training" and (d.get("verdict") or {}).get("decision") == "select"
        )
        rejected = sum(1 for d in self.decisions if (d.get("verdict") or {}).get("decision") == "reject")
        return published, rejected

    def releases(self) -> list[dict[str, Any]]:
        return [
            {
                "release_id": rid,
                "requests": int(r["requests"]),
                "mean_score": r["score_sum"] / r["requests"],
                "success_rate": r["successes"] / r["requests"],
            }
            for rid, r in self.per_release.items()
        ]


# -- traffic -------------------------------------------------------------------------------------


async def _ask(
    client: httpx.AsyncClient,
    task: dict[str, Any],
    examples: int,
    temperature: float,
    max_tokens: int,
    tasks: Any = demo_tasks,
) -> tuple[httpx.Response, str, str]:
    """One demo question as a chat request: (the response, the answer's text, its finish reason)."""
    body = {
        "model": "smollm2",
        "messages": tasks.messages(task, examples),
        "temperature": temperature,
        "max_tokens": max_tokens,
    }
    response = await client.post("/v1/chat/completions", json=body, headers=HEADERS)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return response, choice["message"].get("content") or "", choice.get("finish_reason") or ""


async def _one_request(client: httpx.AsyncClient, task: dict[str, Any], stats: DemoStats) -> None:
    response, text, finish = await _ask(client, task, stats.examples, stats.temperature, stats.max_tokens, stats.tasks)
    value = stats.tasks.score(task, text, finish)
    stats.record(response.headers.get("x-reef-release-id", "?"), value, value == 1.0)
    receipt = response.headers["x-reef-agent-record-id"]
    report = {"references": [receipt], "score": value, "feedback": stats.tasks.feedback(task)}
    (await client.post("/reef/report", json=report)).raise_for_status()
    stats.reports += 1


async def _worker(
    client: httpx.AsyncClient,
    stats: DemoStats,
    rng: random.Random,
    stop: asyncio.Event,
    server: DemoServer,
    pause: float = 0.0,
) -> None:
    """One client: a question, its score reported, the next (after `pause` seconds: an agent's turns)."""
    train = stats.tasks.train_tasks()
    while not stop.is_set():
        stats.requests += 1
        stats.in_flight += 1
        try:
            await _one_request(client, rng.choice(train), stats)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            stats.errors += 1
            stats.last_error = f"{type(exc).__name__}: {exc}"[:200]
            server.check_alive()
            await asyncio.sleep(0.5)
        finally:
            stats.in_flight -= 1
        if pause:
            await asyncio.sleep(pause)


async def poll_learning(client: httpx.AsyncClient, stats: DemoStats) -> None:
    """Fetch the gate's decisions (or, without that route, the chain's training releases)."""
    if stats.decisions_route:
        response = await client.get(f"/reef/scenarios/{SCENARIO}/decisions")
        if response.status_code == 200:
            stats.decisions = list(response.json().get("decisions", []))
        elif response.status_code == 404 and "scenario" not in response.text.lower():
            stats.decisions_route = False  # the route is not there yet: carry on without it
    if not stats.decisions_route:
        response = await client.get(f"/reef/scenarios/{SCENARIO}/releases")
        if response.status_code == 200:
            stats.decisions = [r for r in response.json().get("releases", []) if r.get("operation") == "training"]
    response = await client.get("/reef/status")
    if response.status_code == 200:
        stats.learning = response.json().get("learning") or {}


async def _poller(client: httpx.AsyncClient, stats: DemoStats, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await poll_learning(client, stats)
        except (httpx.HTTPError, ValueError):
            pass
        await asyncio.sleep(POLL_SECONDS)


# -- the test questions ------------------------------------------------------------------------


TEST_ATTEMPTS = 3


async def _ask_test(
    client: httpx.AsyncClient, task: dict[str, Any], examples: int, limit: asyncio.Semaphore
) -> tuple[str, float]:
    async with limit:
        response, text, _ = await _ask(client, task, examples, 0, GATE_MAX_TOKENS)
    return response.headers.get("x-reef-release-id", "?"), demo_tasks.gate_score(task, text)


async def measure_test(client: httpx.AsyncClient, examples: int, concurrency: int) -> dict[str, Any]:
    """Greedy exact success of the serving release on the test questions, asked as the gate asks
    its own (never reported, so never trained on). Should the head move while they are answered,
    they are all asked again, up to TEST_ATTEMPTS times; `release_id` is None if it never held."""
    tasks = demo_tasks.test_tasks()
    limit = asyncio.Semaphore(concurrency)
    answers: list[tuple[str, float]] = []
    for _ in range(TEST_ATTEMPTS):
        answers = list(await asyncio.gather(*(_ask_test(client, t, examples, limit) for t in tasks)))
        if len({release for release, _ in answers}) == 1:
            break
    releases = {release for release, _ in answers}
    return {
        "release_id": releases.pop() if len(releases) == 1 else None,
        "n": len(answers),
        "success": sum(value for _, value in answers) / len(answers) if answers else None,
    }


def canary_running(learning: dict[str, Any]) -> bool:
    """Whether a canary serves the demo's scenario: the gate is judging a candidate."""
    return any(
        (learner.get("canary") or {}).get("running")
        for learner in learning.get("learners") or []
        if learner.get("scenario") == SCENARIO
    )


async def canary_settled(client: httpx.AsyncClient, timeout: float = 240.0) -> bool:
    """Wait until no canary serves the demo's scenario (the gate has judged the last candidates
    the traffic's samples made), so the test questions reach the published head only."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = await client.get("/reef/status", timeout=30.0)
        if not canary_running(response.json().get("learning", {}) if response.status_code == 200 else {}):
            return True
        await asyncio.sleep(1.0)
    return False


async def drive(url: str, stats: DemoStats, concurrency: int, server: DemoServer, console: Any, seed: int = 0) -> None:
    from rich.live import Live

    from reef.demo.live import live_view

    stop = asyncio.Event()
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=300.0, limits=limits) as client:
        console.print(f"reef demo: asking the starting release the {len(demo_tasks.test_tasks())} test questions")
        stats.test["start"] = await measure_test(client, stats.examples, concurrency)
        stats.started, stats.started_wall = time.monotonic(), time.time()  # the clock starts with the traffic
        workers = [asyncio.create_task(_worker(client, stats, rng, stop, server)) for _ in range(concurrency)]
        poller = asyncio.create_task(_poller(client, stats, stop))
        try:
            with Live(live_view(stats), console=console, refresh_per_second=2) as live:
                while stats.traffic_goes_on():
                    for task in workers:
                        if task.done() and task.exception() is not None:
                            raise task.exception()  # type: ignore[misc]
                    live.update(live_view(stats))
                    await asyncio.sleep(0.5)
                stats.traffic_minutes = stats.elapsed()
                stop.set()  # no new requests; let the ones in flight finish (briefly)
                await asyncio.wait(workers, timeout=30)
                live.update(live_view(stats))
            if not await canary_settled(client):
                console.print("reef demo: a canary still serves; the test answers may come from two releases")
            console.print("reef demo: asking the final release the test questions")
            asked_at = round(stats.elapsed(), 4)  # after the traffic and the canary's last verdict
            stats.test["final"] = {**await measure_test(client, stats.examples, concurrency), "minute": asked_at}
        finally:
            stop.set()
            for task in [*workers, poller]:
                task.cancel()
            await asyncio.gather(*workers, poller, return_exceptions=True)


# -- the demo ------------------------------------------------------------------------------------


def run_demo(
    minutes: float = 15,
    workdir: Path | None = None,
    model_dir: Path | None = None,
    concurrency: int = 8,
    out_dir: Path = Path("reef-demo"),
    console: Any = None,
    examples: int = demo_tasks.SHOWN_EXAMPLES,
    temperature: float = TRAFFIC_TEMPERATURE,
    lr: float = LEARNING_RATE,
    runtime: str = "embedded",
    canary: float = CANARY,
    loss: str = LOSS,
    weights: str = "lora",
    ranks: int = 1,
) -> DemoResult:
    from rich.console import Console

    console = console or Console()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="reef-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    heldout = demo_tasks.write_heldout_jsonl(workdir / "heldout.jsonl", examples)
    port = free_port()
    config = workdir / "serve.yaml"
    settings = demo_settings(
        workdir, heldout, port, model_dir, lr, runtime, canary=canary, loss=loss, weights=weights, ranks=ranks
    )
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    server = DemoServer(config, port, (out_dir / "serve.log").resolve())
    console.print(f"reef demo: starting reef serve on {server.url} (state in {workdir}, log {server.log_path})")
    stats = DemoStats(
        minutes=minutes, examples=examples, temperature=temperature, lr=lr, runtime=runtime, canary=canary, loss=loss
    )
    interrupted = False
    with _sigterm_as_interrupt():
        try:
            server.start()
            console.print(f"reef demo: the dashboard, while the demo runs: {server.url}/ui")
            stats = DemoStats(
                minutes=minutes,
                examples=examples,
                temperature=temperature,
                lr=lr,
                runtime=runtime,
                canary=canary,
                loss=loss,
            )  # a fresh clock
            asyncio.run(drive(server.url, stats, concurrency, server, console))
        except KeyboardInterrupt:
            interrupted = True
            console.print("reef demo: interrupted; stopping the server and writing the curve")
        finally:
            try:
                if server.alive():
                    asyncio.run(_final_poll(server.url, stats))
            except (httpx.HTTPError, ValueError, KeyboardInterrupt):
                pass
            server.stop()
    return _finish(stats, out_dir, server, interrupted, console)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the demo as Ctrl-C does (server stopped, curve written), not mid-air."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    # A shell starts a background job (`reef demo &`) with SIGINT ignored: SIGTERM's SIGINT would
    # then be lost, and the demo would never stop. Restore Python's own handler for the run.
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


async def _final_poll(url: str, stats: DemoStats) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        await poll_learning(client, stats)


def _finish(stats: DemoStats, out_dir: Path, server: DemoServer, interrupted: bool, console: Any) -> DemoResult:
    heldout, rejected = stats.heldout_points()
    published, rejected_count = stats.counts()
    rolling = rolling_success(stats.traffic)
    window = min(len(rolling), 48)
    successes = [p["success"] for p in stats.traffic]
    start = heldout[0]["success"] if heldout else None
    final = heldout[-1]["success"] if heldout else None
    result = DemoResult(
        start_heldout_success=start,
        best_heldout_success=max((p["success"] for p in heldout), default=None),
        final_heldout_success=final,
        improvement_points=None if start is None or final is None else round(100 * (final - start), 2),
        releases_published=published,
        releases_rejected=rejected_count,
        requests=stats.requests,
        reports=stats.reports,
        errors=stats.errors,
        minutes=round(stats.traffic_minutes if stats.traffic_minutes is not None else stats.elapsed(), 3),
        live_success_first=sum(successes[:window]) / window if window else None,
        live_success_last=sum(successes[-window:]) / window if window else None,
        start_test_success=stats.test.get("start", {}).get("success"),
        final_test_success=stats.test.get("final", {}).get("success"),
        final_test_release=stats.test.get("final", {}).get("release_id"),
        interrupted=interrupted,
        png=str(out_dir / "learning_curve.png"),
        json=str(out_dir / "learning_curve.json"),
        server_log=str(server.log_path),
    )
    settings = {
        "examples": stats.examples,
        "temperature": stats.temperature,
        "lr": stats.lr,
        "minutes": stats.minutes,
        "runtime": stats.runtime,
        "canary": stats.canary,
        "loss": stats.loss,
    }
    curve = {
        "scenario": SCENARIO,
        "settings": settings,
        "heldout": heldout,
        "rejected": rejected,
        "traffic": stats.traffic,
        "releases": stats.releases(),
        "test": stats.test,
        "decisions": stats.decisions,
        "summary": result.to_json(),
    }
    write_curve(curve, out_dir)
    console.print(curve_table(curve))
    console.print(_summary_line(result))
    return result


def _summary_line(r: DemoResult) -> str:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    gain = "-" if r.improvement_points is None else f"{r.improvement_points:+.1f} points"
    return (
        f"reef demo: {r.minutes:.1f} min, {r.requests} requests ({r.requests / max(r.minutes, 1e-9):.0f} a minute), {r.reports} reports, {r.releases_published} "
        f"releases published, {r.releases_rejected} rejected; held-out success {pct(r.start_heldout_success)} -> "
        f"{pct(r.final_heldout_success)} (best {pct(r.best_heldout_success)}, {gain}); test success (nothing "
        f"selected on it) {pct(r.start_test_success)} -> {pct(r.final_test_success)}; curve: {r.png}"
    )


__all__ = ["DemoResult", "DemoServerError", "DemoStats", "run_demo"]
