"""Counts what a `Ledger` (tests/helpers/mixed_load.py) says was acknowledged against what Reef
holds: every acknowledged receipt a record of its scenario, every acknowledged report attached
to its record exactly once, every acknowledged release in its scenario's chain; and what is lost
(acknowledged, not there) or duplicated (there twice, or one receipt given for two requests).

The records and their reports are read with the experience store's own `iter_records` (the
store the front ends write: the SQLite file of the state directory or the PostgreSQL
database), beside the running server; the chains and a sample of receipts through the HTTP
API of the front ends.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from reef.core.types import RecordStatus
from reef.observe.store import ExperienceStore
from tests.helpers.mixed_load import Ledger

HTTP_SAMPLE = 10  # receipts also read back through the API at each check
HEAD_RACE_TRIES = 5


@dataclass
class Counts:
    acked: int = 0
    present: int = 0
    lost: int = 0
    duplicated: int = 0


@dataclass
class CheckResult:
    receipts: Counts = field(default_factory=Counts)
    reports: Counts = field(default_factory=Counts)
    releases: Counts = field(default_factory=Counts)
    wrong_scenario: int = 0  # acknowledged receipts stored under another scenario
    in_progress: int = 0  # records a crash cut, left in_progress
    stored_reports_not_acked: int = 0  # in flight at a kill: stored, the client never heard
    broken_chains: list[str] = field(default_factory=list)  # a chain listing out of order
    http_sample_missing: list[str] = field(default_factory=list)
    lost_examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.receipts.lost
            or self.receipts.duplicated
            or self.reports.lost
            or self.reports.duplicated
            or self.releases.lost
            or self.releases.duplicated
            or self.wrong_scenario
            or self.broken_chains
            or self.http_sample_missing
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def check(
    ledger: Ledger,
    open_store: Callable[[], ExperienceStore],
    urls: list[str],
    rng: random.Random,
    timeout: float = 60.0,
) -> CheckResult:
    """Check a snapshot of `ledger` (take it before calling: what was acknowledged up to then)."""
    result = CheckResult()
    store = open_store()
    try:
        stored, attached = _read_store(store, ledger.scenarios, result)
    finally:
        store.close()
    _count_receipts(ledger, stored, result)
    _count_reports(ledger, attached, result)
    with httpx.Client(timeout=timeout) as http:
        for scenario in ledger.scenarios:
            _count_releases(http, urls, rng, ledger, scenario, result, timeout)
        sample = rng.sample(sorted(ledger.receipts), min(HTTP_SAMPLE, len(ledger.receipts)))
        for receipt in sample:
            got = _get(http, f"{rng.choice(urls)}/reef/records/{receipt}", timeout)
            if got is None or got.status_code != 200 or got.json()["record"]["scenario"] != ledger.receipts[receipt]:
                result.http_sample_missing.append(f"{receipt}: {got.status_code if got is not None else 'no answer'}")
    return result


def _read_store(
    store: ExperienceStore, scenarios: list[str], result: CheckResult
) -> tuple[dict[str, list[str]], collections.Counter[str]]:
    """record id -> the scenarios it was read under; report id -> how many times it is attached."""
    stored: dict[str, list[str]] = collections.defaultdict(list)
    attached: collections.Counter[str] = collections.Counter()
    for scenario in scenarios:
        for item in store.iter_records(scenario):
            stored[item.record.id].append(scenario)
            attached.update(report.id for report in item.reports)
            if item.record.status is RecordStatus.IN_PROGRESS:
                result.in_progress += 1
    return stored, attached


def _count_receipts(ledger: Ledger, stored: dict[str, list[str]], result: CheckResult) -> None:
    counts = result.receipts
    counts.acked = len(ledger.receipts)
    counts.duplicated = ledger.receipts_given_twice + sum(len(s) - 1 for s in stored.values() if len(s) > 1)
    for receipt, scenario in ledger.receipts.items():
        where = stored.get(receipt)
        if not where:
            counts.lost += 1
            if len(result.lost_examples) < 10:
                result.lost_examples.append(f"receipt {receipt} ({scenario})")
        elif scenario not in where:
            result.wrong_scenario += 1
        else:
            counts.present += 1


def _count_reports(ledger: Ledger, attached: collections.Counter[str], result: CheckResult) -> None:
    counts = result.reports
    counts.acked = len(ledger.reports)
    for report_id in ledger.reports:  # each names one receipt: attached once
        times = attached.get(report_id, 0)
        if times == 0:
            counts.lost += 1
            if len(result.lost_examples) < 10:
                result.lost_examples.append(f"report {report_id}")
        else:
            counts.present += 1
            counts.duplicated += times - 1
    result.stored_reports_not_acked = sum(1 for report_id in attached if report_id not in ledger.reports)


def _count_releases(
    http: httpx.Client,
    urls: list[str],
    rng: random.Random,
    ledger: Ledger,
    scenario: str,
    result: CheckResult,
    timeout: float,
) -> None:
    counts = result.releases
    acked = [r for r, s in ledger.releases.items() if s == scenario]
    counts.acked += len(acked)
    url = f"{rng.choice(urls)}/reef/scenarios/{scenario}/releases"
    for _ in range(HEAD_RACE_TRIES):  # the head and the list are two reads: a rollback may land between
        got = _get(http, url, timeout)
        if got is None or got.status_code != 200 or _head_first(got.json()):
            break
    if got is None or got.status_code != 200:
        result.broken_chains.append(f"{scenario}: releases not readable ({got.status_code if got else 'no answer'})")
        counts.lost += len(acked)
        return
    chain = got.json()
    ids = [r["release_id"] for r in chain["releases"]]
    steps = [r["step"] for r in chain["releases"]]
    counts.duplicated += len(ids) - len(set(ids))
    listed = set(ids)
    present = sum(1 for r in acked if r in listed)
    counts.present += present
    counts.lost += len(acked) - present
    if steps != sorted(steps, reverse=True) or len(set(steps)) != len(steps) or chain["head"] != ids[0]:
        result.broken_chains.append(f"{scenario}: steps {steps[:8]}..., head {chain['head']}")


def _head_first(chain: dict[str, Any]) -> bool:
    releases = chain["releases"]
    return bool(releases) and releases[0]["release_id"] == chain["head"]


def _get(http: httpx.Client, url: str, timeout: float) -> httpx.Response | None:
    """GET with retries until a non-5xx answer or the deadline (a worker may be starting)."""
    deadline = time.monotonic() + timeout
    answer = None
    while time.monotonic() < deadline:
        try:
            answer = http.get(url)
            if answer.status_code < 500:
                return answer
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return answer
