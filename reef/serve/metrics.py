"""Prometheus metrics, one registry per app so several servers in one process stay apart."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("reef_requests", "Inference requests by route, scenario and status",
                                ["route", "scenario", "status"], registry=self.registry)
        self.latency = Histogram("reef_request_latency_seconds", "Inference request latency", ["route", "scenario"],
                                 registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.tokens = Counter("reef_tokens", "Tokens by scenario and kind (prompt, completion)",
                              ["scenario", "kind"], registry=self.registry)
        self.records = Counter("reef_records", "Records written by scenario and status", ["scenario", "status"],
                               registry=self.registry)
        self.unverified = Counter("reef_unverified_records", "Records whose token spans do not match their release",
                                  ["scenario"], registry=self.registry)
        self.reports = Counter("reef_reports", "Reports accepted by scenario", ["scenario"], registry=self.registry)
        self.in_flight = Gauge("reef_requests_in_flight", "Inference requests running now", registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
