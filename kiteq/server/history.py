"""One hour of the broker's figures in a fixed-size ring, for the dashboard's charts.

The browser used to keep its own minute of history and derive rates from cumulative
counters, so a fresh page knew nothing and its first rate was everything counted since
the broker started. Here the broker samples itself every `history_interval` seconds
(`sample_every`, a task of its nursery) and `History.record` keeps the samples, rates
computed between consecutive samples: the first sample has no rates (None), never a
spike. `GET /stats/history` serves the ring.

`History` is pure (a /stats snapshot and a time in, a sample out); the loop reads the
injected wall clock, so tests drive it with Trio's autojump clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from kiteq.server.clock import WallClock

HISTORY_SECONDS = 3600.0
# A short interval (tests) gets more samples, up to this many, then a shorter history.
MAX_SAMPLES = 3600
# Per sample, the groups and topics with the largest backlog (then by name) are kept
# apart, the rest counted in `omitted`: a sample's size does not grow with the fleet.
MAX_SERIES = 32
GROUP_RATES = {"delivered": ("delivered",), "acked": ("acked",), "failed": ("nacked", "timeout")}
TOPIC_RATES = {"stored": ("stored",), "acked": ("acked",)}


def capacity_for(interval: float) -> int:
    """How many samples make an hour at `interval` seconds (at most MAX_SAMPLES)."""
    return max(1, min(MAX_SAMPLES, math.ceil(HISTORY_SECONDS / interval)))


def rates(
    now: Mapping[str, int],
    before: Mapping[str, int] | None,
    seconds: float,
    kinds: Mapping[str, tuple[str, ...]],
) -> dict[str, float] | None:
    """Events per second between two cumulative readings; None without an earlier one."""
    if before is None or seconds <= 0:
        return None
    return {
        name: round(max(0, sum(now.get(e, 0) - before.get(e, 0) for e in events)) / seconds, 3)
        for name, events in kinds.items()
    }


def largest(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The MAX_SERIES names with the largest backlog, in name order."""
    ranked = sorted(rows, key=lambda name: (-int(rows[name].get("backlog", 0)), name))
    return sorted(ranked[:MAX_SERIES])


class History:
    """The ring of samples; `record` appends one, `since` reads them oldest first."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.samples: deque[dict[str, Any]] = deque(maxlen=capacity_for(interval))
        self._previous: tuple[float, dict[str, Any]] | None = None

    def record(self, t: float, stats: Mapping[str, Any], latency: Mapping[str, Any]) -> dict[str, Any]:
        """Append the sample of a /stats snapshot taken at wall-clock time `t`.

        `latency` is the interval's figures (`Latencies.interval()`). Only the counters
        this sample needs are kept from `stats` for the next one's rates.
        """
        previous_t, before = self._previous if self._previous else (t, None)
        seconds = t - previous_t
        groups, topics = stats["groups"], stats["topics"]
        shown_groups, shown_topics = largest(groups), largest(topics)
        sample = {
            "t": round(t, 3),
            "rates": rates(
                stats["events"], before and before["events"], seconds, {e: (e,) for e in stats["events"]}
            ),
            "backlog": sum(stats["store"]["backlog_by_topic"].values()),
            "inflight": sum(row["inflight"] for row in groups.values()),
            "connections": stats["connections"]["total"],
            "dead_letters": stats["dead_letters"]["total"],
            "groups": {
                name: {
                    "backlog": groups[name]["backlog"],
                    "inflight": groups[name]["inflight"],
                    "connections": groups[name]["connections"],
                    "rates": rates(
                        groups[name]["events"],
                        before and before["groups"].get(name),
                        seconds,
                        GROUP_RATES,
                    ),
                }
                for name in shown_groups
            },
            "topics": {
                name: {
                    "backlog": topics[name]["backlog"],
                    "rates": rates(
                        topics[name]["events"], before and before["topics"].get(name), seconds, TOPIC_RATES
                    ),
                }
                for name in shown_topics
            },
            "omitted": {"groups": len(groups) - len(shown_groups), "topics": len(topics) - len(shown_topics)},
            "latency": dict(latency),
        }
        self._previous = (
            t,
            {
                "events": dict(stats["events"]),
                "groups": {name: dict(groups[name]["events"]) for name in shown_groups},
                "topics": {name: dict(topics[name]["events"]) for name in shown_topics},
            },
        )
        self.samples.append(sample)
        return sample

    def since(self, t: float | None = None) -> list[dict[str, Any]]:
        """The samples taken after `t` (all of them without one), oldest first."""
        return [sample for sample in self.samples if t is None or sample["t"] > t]


async def sample_every(
    history: History,
    clock: WallClock,
    read: Callable[[], Awaitable[dict[str, Any]]],
    roll: Callable[[], dict[str, Any]],
) -> None:
    """Record a sample every `history.interval` seconds until cancelled.

    `read` is the broker's /stats snapshot; `roll` closes the latency interval and
    returns its figures. Sampling is on a fixed cadence from the first sample, so a slow
    snapshot delays one sample, not every one after it.
    """
    deadline = trio.current_time()
    while True:
        stats = await read()
        history.record(clock(), stats, roll())
        deadline = max(deadline + history.interval, trio.current_time())
        await trio.sleep_until(deadline)
