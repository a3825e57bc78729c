"""Mixed client load on one or more Reef front ends, and a ledger of what they acknowledged.

Each client (a thread) loops: a chat completion through the official openai SDK to a random
scenario on a random front end (a share of them streamed), then, on a share of receipts, a
report (httpx, to a random front end: receipts cross front ends), and now and then a rollback
of the scenario to its first release. Everything answered with a 2xx goes in the `Ledger`
(a streamed receipt counts once its head arrived: the record is durable before the first
byte); every other outcome is counted by operation and kind: `5xx`; `locked`, a 5xx naming a
git lock; `conn`, a request in flight that was reset or timed out; `refused`, a connection
nothing accepted (the front end was down); `cut`, a stream cut after its head; `409`, a
rollback that lost a race; `4xx`, anything else.

    ledger = Ledger(first_releases)
    load = MixedLoad([url], ledger, seed=1, clients=4).start()
    ...
    load.stop()
"""

from __future__ import annotations

import collections
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import httpx2  # the openai SDK's own HTTP client: what it raises beneath its APIError
import openai

MESSAGES = [{"role": "user", "content": "keep going"}]
HTTP_ERRORS = (httpx.HTTPError, httpx2.HTTPError)
SAMPLES_KEPT = 20  # unexpected answers kept per operation, to show in a report


@dataclass
class Ledger:
    """What the server acknowledged with a 2xx, and how every other answer went."""

    first_releases: dict[str, str]  # scenario -> its first release (the rollbacks' target)
    receipts: dict[str, str] = field(default_factory=dict)  # receipt -> scenario
    reports: dict[str, str] = field(default_factory=dict)  # report id -> the receipt it names
    releases: dict[str, str] = field(default_factory=dict)  # release id -> scenario
    receipts_given_twice: int = 0  # the same receipt acknowledged for two requests
    outcomes: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)  # op -> unexpected answers
    # what the deployment was going through (set by whoever breaks it): "steady" or, say,
    # "after a kill" until it serves again; failures are counted by phase too
    phase: str = "steady"
    failures_by_phase: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    connection_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    rollback_seconds: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def scenarios(self) -> list[str]:
        return sorted(self.first_releases)

    def receipt(self, receipt: str, scenario: str, op: str) -> None:
        with self.lock:
            if receipt in self.receipts:
                self.receipts_given_twice += 1
            self.receipts[receipt] = scenario
            self.outcomes[op, "2xx"] += 1

    def report(self, report_id: str, receipt: str) -> None:
        with self.lock:
            self.reports[report_id] = receipt
            self.outcomes["report", "2xx"] += 1

    def release(self, release_id: str, scenario: str, seconds: float) -> None:
        with self.lock:
            self.releases[release_id] = scenario
            self.outcomes["rollback", "2xx"] += 1
            self.rollback_seconds.append(seconds)

    def failed(self, op: str, kind: str, detail: str = "") -> None:
        with self.lock:
            self.outcomes[op, kind] += 1
            self.failures_by_phase[self.phase, kind] += 1
            if kind in ("conn", "refused", "cut"):
                self.connection_errors[f"{op} {kind}: {detail}"] += 1
            elif detail and kind != "409":
                kept = self.samples.setdefault(op, [])
                if len(kept) < SAMPLES_KEPT:
                    kept.append(detail[:300])

    def snapshot(self) -> Ledger:
        """A copy of what was acknowledged up to now (to check while the load goes on)."""
        with self.lock:
            return Ledger(
                first_releases=dict(self.first_releases),
                receipts=dict(self.receipts),
                reports=dict(self.reports),
                releases=dict(self.releases),
                receipts_given_twice=self.receipts_given_twice,
            )

    def counts(self, kind: str) -> dict[str, int]:
        """Per operation, the answers of one kind (`2xx`, `5xx`, `conn`, `refused`, `cut`, `409`, `4xx`)."""
        with self.lock:
            return {op: n for (op, k), n in self.outcomes.items() if k == kind}


def _connection_kind(exc: BaseException) -> str:
    """`refused`: nothing listened (the front end was down); `conn`: a request in flight was
    reset or timed out."""
    cause = exc if isinstance(exc, HTTP_ERRORS) else exc.__cause__
    refused = isinstance(cause, (httpx.ConnectError, httpx2.ConnectError))
    return "refused" if refused else "conn"


def _error_name(exc: BaseException) -> str:
    cause = exc.__cause__
    return type(exc).__name__ + (f" ({type(cause).__name__}: {cause})" if cause else "")


def _kind(status: int, text: str = "") -> str:
    """`locked`: a 5xx that names a git lock (a stale `*.lock` refusing a ref move)."""
    if status < 300:
        return "2xx"
    if status >= 500:
        return "locked" if "cannot lock" in text or ".lock" in text else "5xx"
    return "409" if status == 409 else "4xx"


@dataclass
class LoadShape:
    clients: int = 4
    stream_share: float = 0.3
    report_share: float = 0.5
    rollback_share: float = 0.04
    timeout: float = 15.0


class MixedLoad:
    def __init__(self, urls: list[str], ledger: Ledger, seed: int, shape: LoadShape | None = None) -> None:
        self.urls = urls
        self.ledger = ledger
        self.shape = shape or LoadShape()
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(
                target=self._client,
                args=(self.rng.random(),),
                daemon=True,
                name=f"load-{i}",
            )
            for i in range(self.shape.clients)
        ]

    def start(self) -> MixedLoad:
        for thread in self.threads:
            thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def _client(self, seed: float) -> None:
        rng = random.Random(seed)
        sdks = {
            url: openai.OpenAI(
                base_url=f"{url}/v1",
                api_key="unused",
                max_retries=0,
                timeout=self.shape.timeout,
            )
            for url in self.urls
        }
        with httpx.Client(timeout=self.shape.timeout) as http:
            while not self.stopping.is_set():
                try:
                    self._exchange(rng, sdks, http)
                except Exception as exc:  # noqa: BLE001  a bench bug must show, not end the client
                    self.ledger.failed("client", "error", repr(exc))
                    time.sleep(0.05)
        for sdk in sdks.values():
            sdk.close()

    def _exchange(self, rng: random.Random, sdks: dict[str, openai.OpenAI], http: httpx.Client) -> None:
        scenario = rng.choice(self.ledger.scenarios)
        stream = rng.random() < self.shape.stream_share
        receipt = self._chat(sdks[rng.choice(self.urls)], scenario, stream)
        if receipt is None:
            time.sleep(0.05)  # a killed front end: do not spin on a refused port
            return
        if rng.random() < self.shape.report_share:
            self._report(http, rng.choice(self.urls), receipt, rng.random())
        if rng.random() < self.shape.rollback_share:
            self._rollback(http, rng.choice(self.urls), scenario)

    def _chat(self, sdk: openai.OpenAI, scenario: str, stream: bool) -> str | None:
        op, receipt = "stream" if stream else "chat", None
        try:
            raw = sdk.chat.completions.with_raw_response.create(
                model="m",
                messages=MESSAGES,
                stream=stream,
                extra_headers={"x-reef-scenario": scenario},
            )  # type: ignore[arg-type]
            receipt = raw.headers["x-reef-agent-record-id"]
            # the record is durable before the head goes out: acknowledged from here on
            self.ledger.receipt(receipt, scenario, op)
            parsed: Any = raw.parse()
            if stream:
                for _ in parsed:
                    pass
            return receipt
        except openai.APIStatusError as exc:
            self.ledger.failed(
                op,
                _kind(exc.status_code, exc.message),
                f"{exc.status_code} {exc.message}",
            )
        except (
            openai.APIError,
            *HTTP_ERRORS,
        ) as exc:  # refused, reset, or a stream cut after its head
            kind = "cut" if receipt else _connection_kind(exc)
            self.ledger.failed(op, kind, _error_name(exc))
        return None

    def _report(self, http: httpx.Client, url: str, receipt: str, score: float) -> None:
        try:
            answer = http.post(f"{url}/reef/report", json={"references": [receipt], "score": score})
        except httpx.HTTPError as exc:
            self.ledger.failed("report", _connection_kind(exc), _error_name(exc))
            return
        if answer.status_code == 200:
            self.ledger.report(answer.json()["report_id"], receipt)
        else:
            self.ledger.failed(
                "report",
                _kind(answer.status_code, answer.text),
                f"{answer.status_code} {answer.text}",
            )

    def _rollback(self, http: httpx.Client, url: str, scenario: str) -> None:
        rollback(http, url, scenario, self.ledger)


def rollback(http: httpx.Client, url: str, scenario: str, ledger: Ledger) -> None:
    """Roll `scenario` back to its first release; the answer goes in `ledger`."""
    started = time.monotonic()
    try:
        answer = http.post(
            f"{url}/reef/scenarios/{scenario}/rollback",
            json={"release_id": ledger.first_releases[scenario]},
            timeout=60,
        )
    except httpx.HTTPError as exc:
        ledger.failed("rollback", _connection_kind(exc), _error_name(exc))
        return
    if answer.status_code == 200:
        ledger.release(answer.json()["release"]["release_id"], scenario, time.monotonic() - started)
    else:  # 409: a concurrent rollback moved the head first
        ledger.failed(
            "rollback",
            _kind(answer.status_code, answer.text),
            f"{answer.status_code} {answer.text}",
        )


class PinnedRollback:
    """A rollback on a connection whose serving process is known (`pid`, read from
    `/reef/status` on the same keep-alive connection), so that very process can be killed while
    the rollback's git and commit-log writes run.

        pinned = PinnedRollback(url, scenario, ledger)
        pinned.start(); time.sleep(delay); os.kill(pinned.pid, SIGKILL); pinned.finish()
    """

    def __init__(self, url: str, scenario: str, ledger: Ledger) -> None:
        self.url, self.scenario, self.ledger = url, scenario, ledger
        self.http = httpx.Client(timeout=60)
        self.pid: int | None = None
        try:
            name = self.http.get(f"{url}/reef/status").json()["learning"]["front_end"]
            self.pid = int(name.rsplit(" ", 1)[1])
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            pass
        self.thread = threading.Thread(target=rollback, args=(self.http, url, scenario, ledger), daemon=True)

    def start(self) -> PinnedRollback:
        self.thread.start()
        return self

    def finish(self) -> None:
        self.thread.join(timeout=70)
        self.http.close()
