"""Prometheus metrics of the server, on a registry of its own (no process-wide globals).

Request-level series (tokens, TTFT, TPOT, outcomes) are recorded by the event loop as outputs arrive; engine-level
series (running and waiting requests, GPU slot and host pool usage, prefetch bytes, hidden fraction, stalls) are
read from the latest `EngineStats` snapshot at scrape time by a custom collector.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .engine_protocol import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 60)
_TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1)


class ServerMetrics:
    """All metrics of one server. `snapshot` returns (engine stats, requests queued in the server, healthy)."""

    THROUGHPUT_WINDOW_S = 10.0

    def __init__(self, snapshot: Callable[[], tuple[EngineStats, int, bool]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("oasis_requests", "Requests that ended, by outcome", ["outcome"], registry=r)
        self.rejected = Counter("oasis_requests_rejected", "Requests refused before admission", ["reason"], registry=r)
        self.prompt_tokens = Counter("oasis_prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter("oasis_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(
            "oasis_time_to_first_token_seconds", "Arrival to first token", buckets=_LATENCY_BUCKETS_S, registry=r
        )
        self.tpot = Histogram(
            "oasis_time_per_output_token_seconds",
            "Mean time between output tokens of a request, after the first",
            buckets=_TPOT_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "oasis_e2e_request_latency_seconds", "Arrival to last token", buckets=_LATENCY_BUCKETS_S, registry=r
        )
        self._window: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()
        r.register(_EngineCollector(snapshot, self.tokens_per_s))

    def on_tokens(self, n: int) -> None:
        if n <= 0:
            return
        self.generation_tokens.inc(n)
        now = time.monotonic()
        with self._lock:
            self._window.append((now, n))
            self._trim(now)

    def tokens_per_s(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            return sum(n for _, n in self._window) / self.THROUGHPUT_WINDOW_S

    def _trim(self, now: float) -> None:
        while self._window and self._window[0][0] < now - self.THROUGHPUT_WINDOW_S:
            self._window.popleft()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    def __init__(self, snapshot: Callable[[], tuple[EngineStats, int, bool]], tokens_per_s: Callable[[], float]):
        self._snapshot = snapshot
        self._tokens_per_s = tokens_per_s

    def describe(self):
        return []  # unchecked collector: the series are produced at scrape time

    def collect(self):
        s, queued, healthy = self._snapshot()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        def ratio(used: int, total: int) -> float:
            return used / total if total else 0.0

        yield gauge("oasis_num_requests_running", "Requests in the running batch", s.running)
        yield gauge(
            "oasis_num_requests_waiting",
            "Requests accepted but not yet running (engine queue + hand-off)",
            s.waiting + queued,
        )
        yield gauge("oasis_gpu_slots_used", "GPU KV slots held by requests", s.gpu_slots_used)
        yield gauge("oasis_gpu_slots_total", "GPU KV slots in the budget", s.gpu_slots_total)
        yield gauge("oasis_gpu_slot_usage", "Share of GPU KV slots in use", ratio(s.gpu_slots_used, s.gpu_slots_total))
        yield gauge("oasis_host_blocks_used", "Host pool KV blocks held by requests", s.host_blocks_used)
        yield gauge("oasis_host_blocks_total", "Host pool KV blocks", s.host_blocks_total)
        yield gauge(
            "oasis_host_pool_usage", "Share of host pool blocks in use", ratio(s.host_blocks_used, s.host_blocks_total)
        )
        yield gauge(
            "oasis_prefetch_hidden_fraction",
            "Share of transfer time hidden behind compute (NaN: not measured)",
            s.hidden_fraction,
        )
        yield gauge(
            "oasis_generation_tokens_per_second", "Generated tokens per second, last 10 s", self._tokens_per_s()
        )
        yield gauge(
            "oasis_engine_healthy",
            "1 while /health reports ok: the engine thread runs, is not stalled and "
            "has not failed since it last proved healthy",
            float(healthy),
        )
        yield CounterMetricFamily(
            "oasis_prefetch_bytes", "Bytes copied host to GPU by the prefetcher", value=s.prefetch_bytes
        )
        yield CounterMetricFamily(
            "oasis_prefetch_stall_seconds",
            "Time layers waited for their transfers (measured with --profile)",
            value=s.stall_s,
        )
        for key, value in sorted(s.extra.items()):
            yield gauge(f"oasis_engine_{key}", f"Engine statistic {key}", value)
