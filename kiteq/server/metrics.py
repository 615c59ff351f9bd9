"""Prometheus exposition for one broker: message counters, latency histograms, gauges.

Cost on the hot path is what decided the shape:
- Counters are read at scrape time from `Events.counts`, which every emit already
  increments, so they add nothing per message and always agree with /stats.
- Latencies arrive through an `Events` observer into plain bucket lists: a bisect and two
  adds (~0.3 µs), where prometheus_client's Histogram takes a lock per bucket (~2 µs) that
  a single-threaded Trio broker does not need.
- Gauges come from the `Broker.stats()` snapshot the /metrics route hands to `render`.

Everything is registered in a per-broker CollectorRegistry, so brokers sharing a process
(the tests do) never mix their series.
"""

from __future__ import annotations

import time
from bisect import bisect_left
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
from stores.entity import MessageEntity

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

# A local save is sub-millisecond, MariaDB a few ms; STORE_TIMEOUT is 10 s.
STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 10.0)
# Push -> ack is the consumer's handling time; up to deliver_timeout (default 30 s) by definition.
ACK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Stored -> acked includes retries with backoff and time spent dead before a redrive.
END_TO_END_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)


class Latency:
    """A histogram without locks, for the broker's one thread: observe is a bisect and two adds."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left puts a value equal to a bound in that bound's bucket, as `le` means.
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs ending with +Inf, as the exposition format wants."""
        cumulative, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            cumulative.append((floatToGoString(bound), float(running)))  # type: ignore[no-untyped-call]
        return cumulative


class BrokerMetrics(Collector):
    """The collector behind GET /metrics; attach once per broker."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.store_latency = Latency(STORE_BUCKETS)
        self.ack_latency: dict[str, Latency] = {}
        self.end_to_end: dict[str, Latency] = {}
        self._snapshot: dict[str, Any] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        ProcessCollector(registry=self.registry)
        events.observers.append(self.observe)

    def observe(self, event: str, entity: MessageEntity, fields: dict[str, object]) -> None:
        """The Events observer: only `stored` and `acked` carry a latency."""
        if event == "acked":
            group = str(fields.get("group", ""))
            ack = self.ack_latency.get(group)
            if ack is None:
                ack = self.ack_latency[group] = Latency(ACK_BUCKETS)
                self.end_to_end[group] = Latency(END_TO_END_BUCKETS)
            ack.observe(float(fields.get("latency_ms", 0.0)) / 1000)  # type: ignore[arg-type]
            if entity.created_at:
                self.end_to_end[group].observe(max(0.0, time.time() - entity.created_at))
        elif event == "stored" and "store_ms" in fields:
            self.store_latency.observe(float(fields["store_ms"]) / 1000)  # type: ignore[arg-type]

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
        store.add_metric((), self.store_latency.buckets(), self.store_latency.total)
        yield store
        for name, doc, by_group in (
            ("kiteq_delivery_ack_seconds", "Push to a consumer -> its ack, per group.", self.ack_latency),
            (
                "kiteq_end_to_end_seconds",
                "Message stored -> acked by the group, retries included.",
                self.end_to_end,
            ),
        ):
            family = HistogramMetricFamily(name, doc, labels=("group",))
            for group, latency in sorted(by_group.items()):
                family.add_metric((group,), latency.buckets(), latency.total)
            yield family

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


def _labelled(
    name: str, doc: str, labels: Sequence[str], values: dict[tuple[str, ...], float]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(key, float(value))
    return family
