"""Prometheus metrics of one server (its own registry, so two apps in one process never mix)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

OUTCOMES = ("completed", "refused", "queue_full", "cancelled", "timeout", "shutdown", "failed")
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ServerMetrics:
    """The Prometheus metrics of one app: outcomes, latencies, the engine's gauges and counters, the
    process."""

    def __init__(self, background):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "caidllm_requests", "Requests by outcome", ["outcome"], registry=self.registry
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.tokens = Counter("caidllm_generated_tokens", "Answer tokens returned", registry=self.registry)
        self.latency = Histogram(
            "caidllm_request_latency_seconds",
            "Request latency (received to last token)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "caidllm_time_to_first_token_seconds",
            "Received to the first committed answer text",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        engine = background.engine
        Gauge("caidllm_queue_depth", "Requests waiting for a slot", registry=self.registry).set_function(
            lambda: background.queued
        )
        Gauge(
            "caidllm_rows_in_flight", "Requests decoding now (rows of the batch)", registry=self.registry
        ).set_function(lambda: engine.scheduler.in_flight)
        Gauge(
            "caidllm_requests_in_engine",
            "Engine requests submitted and not ended (queued or decoding)",
            registry=self.registry,
        ).set_function(lambda: background.pending)
        self.registry.register(_EngineCounters(engine))
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes and the like (Linux)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCounters:
    """The engine's own counters, read at scrape time."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        forwards = CounterMetricFamily("caidllm_forwards", "Model forward passes run by the engine")
        forwards.add_metric([], self.engine.forwards)
        steps = CounterMetricFamily(
            "caidllm_engine_steps", "Engine steps (each advances every request in flight)"
        )
        steps.add_metric([], self.engine.steps)
        yield forwards
        yield steps
        yield from _prefix_store_metrics(self.engine.prefix_store)


PREFIX_COUNTERS = {  # store counter -> (metric, help)
    "lookups": ("caidllm_prefix_cache_lookups", "Requests admitted with the prefix store on"),
    "hits": ("caidllm_prefix_cache_hits", "Requests that took at least one block from the prefix store"),
    "blocks_reused": (
        "caidllm_prefix_cache_blocks_reused",
        "Blocks copied from the prefix store into requests",
    ),
    "positions_saved": (
        "caidllm_prefix_cache_prefill_positions_saved",
        "Prompt positions not prefilled: their keys and values came from the prefix store",
    ),
    "positions_prefilled": ("caidllm_prefix_cache_prefill_positions", "Prompt positions prefilled"),
    "blocks_evicted": ("caidllm_prefix_cache_blocks_evicted", "Blocks evicted from the prefix store"),
}
PREFIX_GAUGES = {
    "blocks_held": ("caidllm_prefix_cache_blocks", "Blocks held by the prefix store now"),
    "bytes_held": ("caidllm_prefix_cache_bytes", "Bytes held by the prefix store now"),
    "budget_bytes": ("caidllm_prefix_cache_budget_bytes", "The prefix store's byte budget (0: off)"),
}


def _prefix_store_metrics(store):
    """The prefix store's counters and gauges (all zero when it is off)."""
    stats = store.stats() if store is not None else {}
    for key, (name, text) in PREFIX_COUNTERS.items():
        family = CounterMetricFamily(name, text)
        family.add_metric([], stats.get(key, 0))
        yield family
    for key, (name, text) in PREFIX_GAUGES.items():
        family = GaugeMetricFamily(name, text)
        family.add_metric([], stats.get(key, 0))
        yield family
