"""The embedded runtime's side of /metrics, through a real `reef serve` on the tiny model: queue
wait and batch size (histograms, one observation per request and per batch), resident runtime
loads (a gauge, by kind), and time to first token of its streams."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.helpers.reef_server import ReefServer

USER = [{"role": "user", "content": "Count to three."}]


@pytest.fixture(scope="module")
def reef(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    settings = {
        "embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": 6, "threads": 1},
        "learner": {"enabled": False},
    }
    with ReefServer(tmp_path_factory.mktemp("reef-metrics"), settings) as server:
        yield server


def value(metrics: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", metrics, re.M)
    assert match, f"no {series} in /metrics"
    return float(match.group(1))


def test_queue_wait_batch_size_resident_loads_and_time_to_first_token(reef: ReefServer) -> None:
    def ask(stream: bool) -> int:
        return httpx.post(
            f"{reef.base_url}/chat/completions",
            timeout=60,
            json={"model": "m", "messages": USER, "max_tokens": 6, "stream": stream},
        ).status_code

    assert ask(False) == 200 and ask(True) == 200
    with ThreadPoolExecutor(4) as pool:  # concurrent: some of them share a batch
        assert list(pool.map(ask, [False] * 4)) == [200] * 4
    metrics = httpx.get(f"{reef.url}/metrics").text
    assert value(metrics, "reef_embedded_queue_wait_seconds_count") == 6  # one per request
    batches = value(metrics, "reef_embedded_batch_size_count")
    assert 2 <= batches <= 6 and value(metrics, "reef_embedded_batch_size_sum") == 6  # each request in one batch
    assert value(metrics, "reef_embedded_queue_wait_seconds_sum") >= 0
    assert value(metrics, 'reef_runtime_loads{kind="base"}') == 1  # the default scenario's base release
    assert value(metrics, 'reef_runtime_loads{kind="adapter"}') == 0
    assert value(metrics, 'reef_time_to_first_token_seconds_count{route="chat_completions",scenario="default"}') == 1
