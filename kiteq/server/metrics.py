"""Prometheus exposition for one broker: message counters, latency histograms, gauges.

Cost on the hot path is what decided the shape:
- Counters are read at scrape time from `Events.counts`, which every emit already
  increments, so they add nothing per message and always agree with /stats.
- Latencies are the broker's own histograms (`kiteq/server/latency.py`, fed by an `Events`
  observer: a bisect and a few adds, ~0.3 µs, where prometheus_client's Histogram takes a
  lock per bucket, ~2 µs, that a single-threaded Trio broker does not need), exposed here
  as histograms and as the p50/p90/p99 the dashboard shows.
- Gauges come from the `Broker.stats()` snapshot the /metrics route hands to `render`.

Everything is registered in a per-broker CollectorRegistry, so brokers sharing a process
(the tests do) never mix their series.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kiteq.server.events import Events
from kiteq.server.latency import ALL_GROUPS, QUANTILES, Histogram, Latencies, merged

# Event name -> (metric name without `_total`, help). Every event `Events.emit` sees.
COUNTERS: dict[str, tuple[str, str]] = {
    "stored": ("kiteq_messages_stored", "Messages saved by the store (a duplicate resend is not counted)."),
    "committed": ("kiteq_messages_committed", "Transactional messages their producer committed."),
    "rolled_back": ("kiteq_messages_rolled_back", "Transactional messages their producer rolled back."),
    "delivered": ("kiteq_messages_delivered", "Deliveries pushed to a consumer of the group."),
    "acked": ("kiteq_messages_acked", "Deliveries the group acknowledged."),
    "nacked": ("kiteq_messages_nacked", "Deliveries the group refused or lost (connection gone)."),
    "timeout": ("kiteq_messages_timed_out", "Deliveries not answered within deliver_timeout."),
    "dropped": ("kiteq_messages_dropped", "Deliveries skipped: the non-persistent group was offline."),
    "dead_lettered": ("kiteq_messages_dead_lettered", "Messages moved to the dead-letter queue."),
    "redriven": ("kiteq_messages_redriven", "Dead letters brought back by /dlq/redrive."),
    "finished": ("kiteq_messages_finished", "Messages every group has had; removed from the backlog."),
    "tx_checked": ("kiteq_tx_checks", "Transaction checks sent to producers by the back-scan."),
}


class BrokerMetrics(Collector):
    """The collector behind GET /metrics; attach once per broker."""

    def __init__(self, events: Events, latency: Latencies) -> None:
        self.events = events
        self.latency = latency
        self._snapshot: dict[str, Any] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        ProcessCollector(registry=self.registry)

    def render(self, stats: dict[str, Any]) -> bytes:
        """The Prometheus text for this broker, its gauges taken from `stats` (Broker.stats())."""
        self._snapshot = stats
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        yield from self._counters()
        yield from self._histograms()
        yield from self._gauges(self._snapshot)

    def _counters(self) -> Iterator[Metric]:
        families = {
            event: CounterMetricFamily(name, doc, labels=("topic", "group"))
            for event, (name, doc) in COUNTERS.items()
        }
        for (event, topic, group), count in sorted(self.events.counts.items()):
            family = families.get(event)
            if family is not None:
                family.add_metric((topic, group), count)
        yield from families.values()

    def _histograms(self) -> Iterator[Metric]:
        store = HistogramMetricFamily(
            "kiteq_store_save_seconds", "Time the store took to save a produced message (successful saves)."
        )
        saves = self.latency.store.cumulative
        store.add_metric((), _buckets(saves), saves.total)
        yield store
        latency = self.latency
        for name, doc, by_group in (
            ("kiteq_delivery_ack_seconds", "Push to a consumer -> its ack, per group.", latency.ack),
            (
                "kiteq_end_to_end_seconds",
                "Message stored -> acked by the group, retries included.",
                latency.end_to_end,
            ),
        ):
            family = HistogramMetricFamily(name, doc, labels=("group",))
            for group, window in latency.groups(by_group).items():
                histogram = window.cumulative
                family.add_metric((group,), _buckets(histogram), histogram.total)
            yield family
        quantiles = GaugeMetricFamily(
            "kiteq_latency_quantile_seconds",
            "Latency percentiles: store (save), end_to_end and ack (group '(all groups)' merges them),"
            " over the last history interval and since start.",
            labels=("kind", "group", "window", "quantile"),
        )
        figures = [("store", "", latency.store)]
        for kind, by_group in (("end_to_end", latency.end_to_end), ("ack", latency.ack)):
            figures += [(kind, ALL_GROUPS, merged(by_group.values()))]
            figures += [(kind, group, window) for group, window in latency.groups(by_group).items()]
        for kind, group, window in figures:
            for name, histogram in (("interval", window.last), ("cumulative", window.cumulative)):
                for q in QUANTILES:
                    value = histogram.percentile(q)
                    if value is not None:
                        quantiles.add_metric((kind, group, name, str(q)), value)
        yield quantiles

    def _gauges(self, stats: dict[str, Any]) -> Iterator[Metric]:
        if not stats:
            return
        registry = stats["registry"]
        store = stats["store"]
        for name, doc, value in (
            ("kiteq_uptime_seconds", "Seconds since the broker started.", stats["uptime"]),
            ("kiteq_connections", "Open client connections.", stats["connections"]["total"]),
            (
                "kiteq_connections_unauthenticated",
                "Connections that have not authenticated yet.",
                stats["connections"]["unauthenticated"],
            ),
            (
                "kiteq_registry_connected",
                "1 while the registry (ZooKeeper) is reachable.",
                registry["connected"],
            ),
            ("kiteq_rounds_in_flight", "Messages being delivered right now.", stats["rounds_in_flight"]),
            ("kiteq_store_messages", "Live (not dead) messages in the store.", store["messages"]),
            ("kiteq_store_uncommitted", "Transactional messages awaiting a decision.", store["uncommitted"]),
        ):
            yield GaugeMetricFamily(name, doc, value=float(value))
        yield _labelled(
            "kiteq_group_connections",
            "Authenticated connections per group.",
            ("group",),
            {(group,): n for group, n in stats["connections"]["by_group"].items()},
        )
        yield _labelled(
            "kiteq_refusals",
            "Refusals since start: failed logins, evicted or broken connections, foreign decisions.",
            ("kind",),
            {(kind,): n for kind, n in stats["security"]["refusals"].items()},
        )
        inflight: dict[tuple[str, ...], float] = {}
        queued: dict[tuple[str, ...], float] = {}
        for lane in stats["lanes"]:
            key = (lane["group"], lane["topic"])
            inflight[key] = inflight.get(key, 0) + lane["inflight"]
            queued[key] = queued.get(key, 0) + lane["queued"]
        yield _labelled(
            "kiteq_inflight", "Deliveries sent and not answered yet.", ("group", "topic"), inflight
        )
        yield _labelled(
            "kiteq_queued", "Deliveries waiting for a watermark slot.", ("group", "topic"), queued
        )
        yield _labelled(
            "kiteq_backlog",
            "Committed messages not yet had by every group, per topic.",
            ("topic",),
            {(topic,): n for topic, n in store["backlog_by_topic"].items()},
        )
        yield _labelled(
            "kiteq_dead_letters",
            "Messages in the dead-letter queue, per reason.",
            ("reason",),
            {(reason,): n for reason, n in stats["dead_letters"]["by_reason"].items()},
        )
        yield _labelled(
            "kiteq_scheduled_messages",
            "Delayed messages (kiteq.deliverAt) not yet delivered, per topic.",
            ("topic",),
            {(topic,): n for topic, n in stats["scheduled"]["by_topic"].items()},
        )
        yield from _group_gauges(stats["groups"])


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs ending with +Inf, as the exposition format wants."""
    return [(floatToGoString(le), float(n)) for le, n in histogram.buckets()]  # type: ignore[no-untyped-call]


def _group_gauges(groups: dict[str, dict[str, Any]]) -> Iterator[GaugeMetricFamily]:
    """Per (group, topic) from the /stats binding rows: what the group still waits for."""
    backlog: dict[tuple[str, ...], float] = {}
    inflight: dict[tuple[str, ...], float] = {}
    oldest: dict[tuple[str, ...], float] = {}
    for group, row in groups.items():
        for binding in row["bindings"]:
            key = (group, binding["topic"])
            backlog[key] = binding["backlog"]  # the topic's count: the same for each binding of it
            inflight[key] = inflight.get(key, 0) + binding["inflight"]
            oldest[key] = max(oldest.get(key, 0.0), binding["oldest_waiting_age"] or 0.0)
    labels = ("group", "topic")
    yield _labelled(
        "kiteq_group_backlog",
        "Committed messages of the topic the group has not acked yet (kept for it while it is away).",
        labels,
        backlog,
    )
    yield _labelled(
        "kiteq_group_inflight", "Deliveries to the group sent and not answered yet.", labels, inflight
    )
    yield _labelled(
        "kiteq_group_oldest_waiting_seconds",
        "Age of the oldest message of the topic the group has not acked (0 when none waits).",
        labels,
        oldest,
    )


def _labelled(
    name: str, doc: str, labels: Sequence[str], values: dict[tuple[str, ...], float]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(key, float(value))
    return family
