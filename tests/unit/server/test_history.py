"""The broker's history ring: rates between consecutive samples, bounds, the sampling loop."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kiteq.server.history import MAX_SAMPLES, MAX_SERIES, History, capacity_for, rates, sample_every

LATENCY = {"store": {"count": 0}, "end_to_end": {"count": 0}}


def stats(stored: int, acked: int, backlog: int = 0, groups: int = 1) -> dict[str, Any]:
    """The parts of a /stats snapshot a sample reads."""
    return {
        "events": {"stored": stored, "acked": acked},
        "groups": {
            f"g{i}": {"backlog": backlog + i, "inflight": 1, "connections": 1, "events": {"acked": acked}}
            for i in range(groups)
        },
        "topics": {"t": {"backlog": backlog, "inflight": 1, "events": {"stored": stored, "acked": acked}}},
        "store": {"backlog_by_topic": {"t": backlog}},
        "connections": {"total": 3},
        "dead_letters": {"total": 0},
    }


@pytest.mark.parametrize(("interval", "capacity"), [(5.0, 720), (1.0, 3600), (0.1, MAX_SAMPLES), (7200.0, 1)])
def test_capacity_is_an_hour_of_samples(interval: float, capacity: int) -> None:
    assert capacity_for(interval) == capacity


@pytest.mark.parametrize(
    ("now", "before", "seconds", "expected"),
    [
        ({"acked": 50}, None, 5.0, None),  # the first sample: no rate, never a spike
        ({"acked": 50}, {"acked": 40}, 5.0, {"acked": 2.0, "failed": 0.0}),
        ({"acked": 50, "nacked": 3, "timeout": 2}, {"acked": 50}, 1.0, {"acked": 0.0, "failed": 5.0}),
        ({"acked": 50}, {"acked": 40}, 0.0, None),  # no time passed
    ],
)
def test_rates(now: dict[str, int], before: dict[str, int] | None, seconds: float, expected: Any) -> None:
    assert rates(now, before, seconds, {"acked": ("acked",), "failed": ("nacked", "timeout")}) == expected


def test_rates_come_from_consecutive_samples_and_the_first_has_none() -> None:
    history = History(5.0)
    first = history.record(1000.0, stats(stored=10_000, acked=9_000, backlog=7), LATENCY)
    assert first["rates"] is None and first["groups"]["g0"]["rates"] is None
    assert first["topics"]["t"]["rates"] is None
    assert (first["backlog"], first["inflight"], first["connections"]) == (7, 1, 3)
    second = history.record(1005.0, stats(stored=10_050, acked=9_025, backlog=7), LATENCY)
    assert second["rates"] == {"stored": 10.0, "acked": 5.0}
    assert second["groups"]["g0"]["rates"] == {"delivered": 0.0, "acked": 5.0, "failed": 0.0}
    assert second["topics"]["t"]["rates"] == {"stored": 10.0, "acked": 5.0}
    assert second["latency"] == LATENCY
    assert [s["t"] for s in history.since()] == [1000.0, 1005.0]
    assert [s["t"] for s in history.since(1000.0)] == [1005.0]


def test_the_ring_keeps_an_hour_and_the_largest_groups() -> None:
    history = History(1800.0)  # two samples make the hour
    for i in range(5):
        history.record(1800.0 * i, stats(stored=i, acked=i, groups=MAX_SERIES + 8), LATENCY)
    samples = history.since()
    assert [s["t"] for s in samples] == [5400.0, 7200.0]
    kept = samples[-1]["groups"]
    assert len(kept) == MAX_SERIES and f"g{MAX_SERIES + 7}" in kept and "g0" not in kept
    assert samples[-1]["omitted"] == {"groups": 8, "topics": 0}


async def test_sampling_loop_keeps_its_cadence(autojump_clock: trio.abc.Clock) -> None:
    history = History(5.0)
    reads = 0
    rolls = 0

    async def read() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        await trio.sleep(1.0)  # a slow snapshot delays its sample, not the ones after it
        return stats(stored=10 * reads, acked=0)

    def roll() -> dict[str, Any]:
        nonlocal rolls
        rolls += 1
        return LATENCY

    with trio.move_on_after(22.5):
        await sample_every(history, trio.current_time, read, roll)
    assert [s["t"] for s in history.since()] == [1.0, 6.0, 11.0, 16.0, 21.0]
    assert rolls == 5 and history.since()[1]["rates"] == {"stored": 2.0, "acked": 0.0}
