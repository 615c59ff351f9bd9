"""Latency histograms: percentiles from fixed log buckets, intervals, the events they read."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kiteq.server.events import Events
from kiteq.server.latency import ALL_GROUPS, BOUNDS, EXPOSED_BOUNDS, Histogram, Latencies, Window
from kiteq.server.metrics import BrokerMetrics
from protocol.logevents import LogEvent
from stores.entity import MessageEntity


def histogram(*seconds: float) -> Histogram:
    h = Histogram()
    for value in seconds:
        h.observe(value)
    return h


def test_bounds_are_ten_per_decade_from_ten_microseconds_and_exact_decimals() -> None:
    assert BOUNDS[:4] == (1e-05, 1.25e-05, 1.5e-05, 2e-05) and BOUNDS[-1] == 8000.0
    assert all(b / a < 1.34 for a, b in itertools.pairwise(BOUNDS))
    assert EXPOSED_BOUNDS[:4] == (0.0001, 0.00025, 0.0005, 0.001) and EXPOSED_BOUNDS[-1] == 5000.0


@pytest.mark.parametrize(
    ("values", "q", "low", "high"),
    [
        ([0.010] * 100, 0.5, 0.008, 0.010),  # all in one bucket: inside it, capped by the max
        ([0.001] * 90 + [1.0] * 10, 0.5, 0.0008, 0.001),
        ([0.001] * 90 + [1.0] * 10, 0.99, 0.8, 1.0),
        ([x / 1000 for x in range(1, 1001)], 0.9, 0.9 * 0.75, 0.9 * 1.34),  # within a bucket's width
        ([20_000.0], 0.5, 8000.0, 20_000.0),  # past the last bound: up to the largest value seen
    ],
)
def test_percentile_lies_within_its_bucket(values: list[float], q: float, low: float, high: float) -> None:
    value = histogram(*values).percentile(q)
    assert value is not None and low <= value <= high


def test_empty_histogram_has_no_percentiles() -> None:
    assert histogram().percentile(0.5) is None
    assert histogram().summary() == {"count": 0, "p50": None, "p90": None, "p99": None, "max": None}


def test_summary_is_in_milliseconds() -> None:
    summary = histogram(0.002, 0.002, 0.002).summary()
    assert summary["count"] == 3 and summary["max"] == 2.0
    assert 1.5 <= summary["p50"] <= 2.0 and summary["p99"] <= 2.0


def test_exposed_buckets_are_cumulative_and_end_with_the_count() -> None:
    pairs = histogram(0.0001, 0.0003, 0.003, 10_000.0).buckets()
    assert pairs[0] == (0.0001, 1)
    assert dict(pairs)[0.0005] == 2 and dict(pairs)[0.005] == 3 and dict(pairs)[5000.0] == 3
    assert pairs[-1] == (float("inf"), 4)


def test_window_keeps_the_last_closed_interval_and_everything() -> None:
    window = Window()
    window.observe(0.001)
    assert window.summary()["interval"]["count"] == 0, "nothing closed yet"
    window.roll()
    window.observe(1.0)
    window.observe(1.0)
    assert window.summary()["interval"]["count"] == 1 and window.summary()["cumulative"]["count"] == 3
    window.roll()
    window.roll()
    assert window.summary()["interval"]["count"] == 0 and window.summary()["cumulative"]["count"] == 3


def entity(created_at: float) -> MessageEntity:
    message = MessageEntity(message_id="a" * 32, topic="t", message_type="x", producer_group="p", body=b"")
    message.created_at = created_at
    return message


def test_latencies_read_stored_and_acked_events_with_the_injected_clock() -> None:
    now = [1000.0]
    latencies = Latencies(lambda: now[0])
    latencies.observe("stored", entity(999.0), {"store_ms": 4.0})
    latencies.observe("stored", entity(999.0), {"commit": True})  # no figure: ignored
    now[0] = 1002.0
    latencies.observe("acked", entity(1000.0), {"group": "g1", "latency_ms": 50.0})
    latencies.observe("acked", entity(1001.0), {"group": "g2", "latency_ms": 10.0})
    latencies.observe("nacked", entity(1000.0), {"group": "g1", "latency_ms": 5.0})
    interval = latencies.roll()
    assert interval["store"]["count"] == 1 and interval["store"]["max"] == 4.0
    assert interval["end_to_end"]["count"] == 2 and interval["end_to_end"]["max"] == 2000.0
    snapshot = latencies.snapshot()
    assert sorted(snapshot["end_to_end"]["by_group"]) == ["g1", "g2"], "the all-groups figure is not a group"
    assert snapshot["end_to_end"]["by_group"]["g2"]["cumulative"]["max"] == 1000.0
    assert snapshot["ack"]["by_group"]["g1"]["cumulative"]["max"] == 50.0
    assert snapshot["ack"]["cumulative"]["count"] == 2
    assert set(latencies.ack) == {"g1", "g2"}, "one window per group: the all-groups one is their sum"


def test_metrics_expose_the_histograms_and_their_percentiles() -> None:
    latencies = Latencies(lambda: 1001.0)
    for _ in range(10):
        latencies.observe("acked", entity(1000.0), {"group": "g", "latency_ms": 3.0})
    latencies.roll()
    found = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(BrokerMetrics(Events(), latencies).render({}).decode())
        for sample in family.samples
    }
    assert found[("kiteq_end_to_end_seconds_bucket", frozenset({("group", "g"), ("le", "1.0")}))] == 10
    assert found[("kiteq_end_to_end_seconds_bucket", frozenset({("group", "g"), ("le", "0.5")}))] == 0
    for group in ("g", ALL_GROUPS):
        for window in ("interval", "cumulative"):
            labels = {("kind", "ack"), ("group", group), ("window", window), ("quantile", "0.99")}
            assert 0.0025 <= found[("kiteq_latency_quantile_seconds", frozenset(labels))] <= 0.003
    assert not any(labels and dict(labels).get("kind") == "store" for _, labels in found), (
        "no saves, no figures"
    )


def test_an_observer_is_called_only_for_the_events_it_subscribed_to() -> None:
    events, seen = Events(), []
    events.subscribe(lambda event, message, fields: seen.append((event, fields.get("group"))), LogEvent.ACKED)
    for event in (LogEvent.DELIVERED, LogEvent.ACKED, LogEvent.FINISHED):
        events.emit(event, entity(1.0), group="g")
    assert seen == [(LogEvent.ACKED, "g")]
    assert events.total(LogEvent.DELIVERED) == 1, "every event is still counted"
