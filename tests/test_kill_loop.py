"""`reef serve` killed with SIGKILL in a loop under load: concurrent clients send requests
(plain and streaming), reports and rollbacks; everything acknowledged with a 2xx (receipts,
report ids, release ids) is collected, and after each restart nothing acknowledged is missing
or duplicated, the release chain is intact and the server serves again (invariants 1, 3-6)."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

ROUNDS = 4
CLIENTS = 4
SCENARIOS = ("kill-a", "kill-b")
USER = [{"role": "user", "content": "keep going"}]


@dataclass
class Acked:
    """What the server acknowledged with a 2xx, across every round."""

    receipts: dict[str, str] = field(default_factory=dict)  # receipt -> scenario
    reports: dict[str, list[str]] = field(default_factory=dict)  # report id -> its receipts
    releases: dict[str, str] = field(default_factory=dict)  # release id -> scenario
    attempted_reports: int = 0
    unexpected: list[str] = field(default_factory=list)  # answers that are neither 2xx nor a fair 409
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream(record=False) as up:
        yield up


def client_loop(url: str, seed: int, first_releases: dict[str, str], acked: Acked, stop: threading.Event) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=10) as http:
        while not stop.is_set():
            scenario = rng.choice(SCENARIOS)
            try:
                one_exchange(http, rng, scenario, first_releases[scenario], acked)
            except httpx.HTTPError:
                if stop.is_set():
                    return
                time.sleep(0.01)  # killed under us: the round is ending


def one_exchange(http: httpx.Client, rng: random.Random, scenario: str, first_release: str, acked: Acked) -> None:
    headers = {"x-reef-scenario": scenario}
    body = {"model": "m", "messages": USER, "stream": rng.random() < 0.3}
    response = http.post("/v1/chat/completions", json=body, headers=headers)
    response.raise_for_status()
    receipt = response.headers["x-reef-agent-record-id"]
    with acked.lock:
        acked.receipts[receipt] = scenario
    roll = rng.random()
    if roll < 0.5:
        with acked.lock:
            acked.attempted_reports += 1
        report = http.post("/reef/report", json={"references": [receipt], "score": rng.random()})
        if report.status_code == 200:
            with acked.lock:
                acked.reports[report.json()["report_id"]] = [receipt]
        else:
            acked.unexpected.append(f"report: {report.status_code} {report.text}")
    elif roll < 0.65:
        rollback = http.post(f"/reef/scenarios/{scenario}/rollback", json={"release_id": first_release})
        if rollback.status_code == 200:
            with acked.lock:
                acked.releases[rollback.json()["release"]["release_id"]] = scenario
        elif rollback.status_code != 409:  # 409: a concurrent rollback moved the head first
            acked.unexpected.append(f"rollback: {rollback.status_code} {rollback.text}")


def check_nothing_lost(reef: ReefServer, acked: Acked) -> None:
    with httpx.Client(base_url=reef.url, timeout=30) as http:
        attached: dict[str, int] = {}
        for receipt, scenario in acked.receipts.items():
            got = http.get(f"/reef/records/{receipt}")
            assert got.status_code == 200, f"acknowledged receipt {receipt} is missing after a restart"
            assert got.json()["record"]["scenario"] == scenario
            report_ids = [r["id"] for r in got.json()["reports"]]
            assert len(report_ids) == len(set(report_ids)), f"a report is attached twice to {receipt}"
            for report_id in report_ids:
                attached[report_id] = attached.get(report_id, 0) + 1
        for report_id, receipts in acked.reports.items():
            assert attached.get(report_id) == len(receipts), f"acknowledged report {report_id} is missing"
        storage = http.get("/reef/status").json()["storage"]
        assert len(acked.reports) <= storage["reports"] <= acked.attempted_reports
        assert storage["records"] >= len(acked.receipts)
        for scenario in SCENARIOS:
            chain = http.get(f"/reef/scenarios/{scenario}/releases").json()
            ids = [r["release_id"] for r in chain["releases"]]
            steps = [r["step"] for r in chain["releases"]]
            assert len(ids) == len(set(ids)), f"{scenario}: a release is listed twice"
            assert steps == list(range(len(steps), 0, -1)), f"{scenario}: steps {steps}"
            assert chain["releases"][0]["current"] and chain["head"] == ids[0]
            missing = [r for r, s in acked.releases.items() if s == scenario and r not in ids]
            assert not missing, f"{scenario}: acknowledged releases missing: {missing}"
        served = http.post(
            "/v1/chat/completions", json={"model": "m", "messages": USER}, headers={"x-reef-scenario": SCENARIOS[0]}
        )
        assert served.status_code == 200


def test_sigkill_under_load_loses_and_duplicates_nothing_acknowledged(
    upstream: ScriptedUpstream, tmp_path: Path
) -> None:
    settings = {
        "state_dir": str(tmp_path / "state"),
        "recipes": {"default": "skills"},
        "upstream": {"url": upstream.base_url, "model": "p", "timeout": 5},
    }
    rng = random.Random(20261130)
    acked = Acked()
    first_releases: dict[str, str] = {}
    for round_no in range(ROUNDS):
        reef = ReefServer(tmp_path, settings).start()
        try:
            if round_no == 0:
                for scenario in SCENARIOS:
                    created = httpx.post(f"{reef.url}/reef/scenarios", json={"name": scenario})
                    first_releases[scenario] = created.json()["head"]["release_id"]
            else:
                check_nothing_lost(reef, acked)
            stop = threading.Event()
            clients = [
                threading.Thread(target=client_loop, args=(reef.url, rng.random(), first_releases, acked, stop))
                for _ in range(CLIENTS)
            ]
            before = len(acked.receipts)
            for client in clients:
                client.start()
            deadline = time.monotonic() + 30
            target = before + rng.randint(15, 40)  # kill at a random moment, once some work got through
            while len(acked.receipts) < target and time.monotonic() < deadline:
                time.sleep(0.01)
            reef.kill()
            stop.set()
            for client in clients:
                client.join(timeout=30)
            assert len(acked.receipts) > before, f"round {round_no}: no request got through before the kill"
            assert not acked.unexpected, acked.unexpected
        finally:
            reef.stop()
    reef = ReefServer(tmp_path, settings).start()
    try:
        check_nothing_lost(reef, acked)
    finally:
        reef.stop()
    assert acked.reports and acked.releases, "the load should include reports and rollbacks"
