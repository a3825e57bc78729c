"""Prometheus metrics, one registry per app so several servers in one process stay apart.

What a request pays is a few counter and histogram updates when it ends (and, for a stream, one
observation at its first token). The embedded runtime reports each batch once, from its worker
thread (`observe_batch`), not each token. Resident runtime loads and the learners' counters are
read only when `/metrics` is scraped (`watch_runtime`, `watch_learning`, `watch_unreachable`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LEARNER_COUNTERS = (
    ("candidates", "Candidates a learner made"),
    ("published", "Candidates the gate selected and that were published"),
    ("rejected", "Candidates the gate rejected"),
    ("abandoned", "Candidates abandoned with a logged reason"),
)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "reef_requests",
            "Inference requests by route, scenario and status",
            ["route", "scenario", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "reef_request_latency_seconds",
            "Inference request latency",
            ["route", "scenario"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.ttft = Histogram(
            "reef_time_to_first_token_seconds",
            "Streams: from admission to the first generated delta, ready to send",
            ["route", "scenario"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.tokens = Counter(
            "reef_tokens",
            "Tokens by scenario and kind (prompt, completion)",
            ["scenario", "kind"],
            registry=self.registry,
        )
        self.records = Counter(
            "reef_records", "Records written by scenario and status", ["scenario", "status"], registry=self.registry
        )
        self.unverified = Counter(
            "reef_unverified_records",
            "Records whose token spans do not match their release",
            ["scenario"],
            registry=self.registry,
        )
        self.reports = Counter("reef_reports", "Reports accepted by scenario", ["scenario"], registry=self.registry)
        self.in_flight = Gauge("reef_requests_in_flight", "Inference requests running now", registry=self.registry)
        self.queue_wait = Histogram(
            "reef_embedded_queue_wait_seconds",
            "Embedded runtime: time a request waited in the queue before it started decoding",
            registry=self.registry,
            buckets=QUEUE_BUCKETS,
        )
        self.batch_size = Histogram(
            "reef_embedded_batch_size",
            "Embedded runtime: requests that started decoding together (one prefill)",
            registry=self.registry,
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
        )

    def observe_batch(self, size: int, waits: Iterable[float]) -> None:
        """Requests started decoding together on the embedded runtime's worker (thread-safe: prometheus_client locks)."""
        self.batch_size.observe(size)
        for wait in waits:
            self.queue_wait.observe(wait)

    def watch_runtime(self, runtime: Any) -> None:
        """Resident runtime loads (and LoRA adapters, on a runtime that has them), read at scrape time;
        the runtime's batches reported to `observe_batch` where it offers the hook."""
        resident: Callable[[], dict[str, int]] | None = getattr(runtime, "resident", None)
        if resident is None:
            return
        loads = Gauge(
            "reef_runtime_loads",
            "Runtime loads resident now, by kind (base, adapter, full)",
            ["kind"],
            registry=self.registry,
        )
        for kind in ("base", "adapter", "full"):
            loads.labels(kind).set_function(lambda kind=kind: resident().get(kind, 0))  # type: ignore[misc]
        if hasattr(runtime, "batch_observer"):
            runtime.batch_observer = self.observe_batch

    def watch_unreachable(self, count: Callable[[str], int]) -> None:
        """Scenarios whose head this front end cannot read, by what it serves instead (`older`; `none`:
        its requests get 503), read at scrape time (`reef/serve/unreachable.py`)."""
        gauge = Gauge(
            "reef_scenarios_unreachable",
            "Scenarios whose head this front end cannot read, by what it serves instead (older, none)",
            ["serving"],
            registry=self.registry,
        )
        for serving in ("older", "none"):
            gauge.labels(serving).set_function(lambda serving=serving: count(serving))  # type: ignore[misc]

    def watch_learning(self, status: Callable[[], dict[str, Any]]) -> None:
        """The learners' counters (`/reef/status`'s `learning.learners[]`), read at scrape time."""
        self.registry.register(_LearnerCollector(status))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LearnerCollector(Collector):
    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        learners = self.status().get("learners", [])
        families = {
            name: CounterMetricFamily(f"reef_learner_{name}", doc, labels=["scenario", "recipe"])
            for name, doc in LEARNER_COUNTERS
        }
        dropped = CounterMetricFamily(
            "reef_learner_dropped", "Records a learner did not use, by reason", labels=["scenario", "recipe", "reason"]
        )
        for learner in learners:
            labels = [learner["scenario"], learner["recipe"]]
            for name, family in families.items():
                family.add_metric(labels, float(learner.get(name, 0)))
            for reason, count in (learner.get("dropped") or {}).items():
                dropped.add_metric([*labels, reason], float(count))
        yield from families.values()
        yield dropped
