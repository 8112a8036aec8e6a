"""The collector's Prometheus endpoint: ``GET /metrics`` in Prometheus's text format, read from the collector when
scraped, for sites that already run Prometheus / Grafana. Behind the collector's token like every other route."""

from __future__ import annotations

import asyncio

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from flowscope.service.collector import Collector

PREFIX = "flowscope_collector"


class CollectorMetrics:
    """A prometheus_client custom collector over one flowscope :class:`Collector` (its counters since it started)."""

    def __init__(self, collector: Collector):
        self.collector = collector

    def collect(self):
        c = self.collector
        health = c.health()

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        yield counter("batches", "batches written to the store (duplicates included)", health["batches"])
        yield counter("duplicate_batches", "batches already in the store when they arrived again (not rewritten)",
                      health["duplicates"])
        yield counter("errors", "batches whose write failed", health["errors"])
        refusals = CounterMetricFamily(f"{PREFIX}_refusals", "requests refused, by reason (busy: HTTP 503)",
                                       labels=["reason"])
        refusals.add_metric(["busy"], health["busy_refusals"])
        yield refusals
        rows = CounterMetricFamily(f"{PREFIX}_rows", "rows written to the store, by canonical table", labels=["table"])
        for table, n in sorted(c.rows_by_table().items()):
            rows.add_metric([table], n)
        yield rows
        runs = GaugeMetricFamily(f"{PREFIX}_runs", "runs this collector opened or closed since it started, by status",
                                 labels=["status"])
        for status, n in sorted(c.runs_by_status().items()):
            runs.add_metric([status], n)
        yield runs
        yield gauge("reserved_bytes", "bytes of the write budget held by batches being decoded or written",
                    health["reserved_bytes"])
        yield gauge("peak_reserved_bytes", "the most bytes of the write budget held at once since start",
                    health["peak_reserved_bytes"])
        yield gauge("budget_bytes", "the write budget: beyond it, requests are refused with HTTP 503",
                    health["queue_bytes"])
        yield gauge("queued_batches", "batches waiting for a writer thread", health["queued_batches"])
        yield gauge("decoding_batches", "request bodies being decoded", health["decoding_batches"])
        yield gauge("start_time_seconds", "when this collector started, seconds since the epoch",
                    c.started_ns / 1e9)


def metrics_routes(collector: Collector) -> list[Route]:
    """``GET /metrics``: the collector's counters and gauges, and its process's CPU and memory."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CollectorMetrics(collector))
    ProcessCollector(registry=registry)

    async def metrics(request: Request) -> Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return [Route("/metrics", metrics, methods=["GET"])]
