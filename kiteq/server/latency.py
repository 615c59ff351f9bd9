"""Latency histograms with fixed log-scale buckets: percentiles in constant memory. Pure.

Two figures an operator asks for, fed by the broker's events (an `Events` observer):

- **store**: how long `store.save_many` took, as the broker saw it (`stored.store_ms`);
  every message of one save counts that save's time, so the figures are per message.
- **end to end**: message created (received and stamped by the broker) -> acked by a
  group, retries and waits in the backlog included; per group and over all groups.
- **ack**: delivery pushed -> the group's answer, per group (the consumer's share).

Each figure is a `Window`: a cumulative histogram since start and the histogram of the
last closed interval (the broker closes one at every history sample), so "p99 now" and
"p99 since start" are both cheap. Buckets are 10 per decade (1, 1.25, 1.5, 2, 2.5, 3, 4,
5, 6, 8 x 10^k) from 10 µs to 8000 s: a percentile is interpolated inside its bucket, so
it is off by at most a bucket's width (< 34 %), and every histogram is 91 integers
whatever the traffic. An observe is a bisect and three adds.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from typing import Any

from kiteq.server.clock import WallClock
from stores.entity import MessageEntity

MANTISSAS = ("1", "1.25", "1.5", "2", "2.5", "3", "4", "5", "6", "8")
# Written as decimal literals so the bounds print exactly (Prometheus shows them as `le`).
BOUNDS: tuple[float, ...] = tuple(float(f"{m}e{exp}") for exp in range(-5, 4) for m in MANTISSAS)
# The subset /metrics exposes (1, 2.5, 5 x 10^k from 100 µs): cumulative counts at a bound
# are exact, so a coarser exposition loses resolution, not correctness.
EXPOSED_BOUNDS: tuple[float, ...] = tuple(
    b for b in BOUNDS if b >= 1e-4 and f"{b:e}"[:3] in ("1.0", "2.5", "5.0")
)
QUANTILES = (0.5, 0.9, 0.99)
ALL_GROUPS = "(all groups)"


class Histogram:
    """Counts per bucket (the last one open-ended), with the sum and the largest value."""

    __slots__ = ("count", "counts", "max", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left puts a value equal to a bound in that bound's bucket, as `le` means.
        self.counts[bisect_left(BOUNDS, seconds)] += 1
        self.count += 1
        self.total += seconds
        if seconds > self.max:
            self.max = seconds

    def clear(self) -> None:
        self.counts = [0] * len(self.counts)
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, other: Histogram) -> None:
        """Count `other`'s observations in this one too."""
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)

    def percentile(self, q: float) -> float | None:
        """The value below which a fraction `q` of the observations fall; None when empty.

        Linear inside the bucket that holds the rank, capped by the largest value seen
        (a bucket's upper bound would overstate a small sample).
        """
        if not self.count:
            return None
        rank = q * self.count
        seen = 0
        for index, n in enumerate(self.counts):
            if n and seen + n >= rank:
                lower = BOUNDS[index - 1] if index else 0.0
                upper = BOUNDS[index] if index < len(BOUNDS) else self.max
                return min(self.max, lower + (upper - lower) * (rank - seen) / n)
            seen += n
        return self.max

    def summary(self) -> dict[str, Any]:
        """count, p50/p90/p99 and max in milliseconds (None without observations)."""
        row: dict[str, Any] = {"count": self.count}
        for q in QUANTILES:
            value = self.percentile(q)
            row[f"p{round(q * 100)}"] = None if value is None else round(value * 1000, 3)
        row["max"] = round(self.max * 1000, 3) if self.count else None
        return row

    def buckets(self, bounds: Iterable[float] = EXPOSED_BOUNDS) -> list[tuple[float, int]]:
        """Cumulative (le, count) at `bounds` (a subset of BOUNDS), then (+Inf, count)."""
        wanted = set(bounds)
        pairs, running = [], 0
        for bound, n in zip(BOUNDS, self.counts, strict=False):
            running += n
            if bound in wanted:
                pairs.append((bound, running))
        pairs.append((float("inf"), self.count))
        return pairs


class Window:
    """The open interval's histogram, the last closed one's, and every closed one's together.

    An observe touches one histogram (it runs per ack); `cumulative` adds the open
    interval to the closed ones when read (/stats, /metrics), and `roll` closes it.
    """

    __slots__ = ("closed", "current", "last")

    def __init__(self) -> None:
        self.closed = Histogram()
        self.current = Histogram()
        self.last = Histogram()

    def observe(self, seconds: float) -> None:
        self.current.observe(seconds)

    @property
    def cumulative(self) -> Histogram:
        """Every observation since start."""
        total = Histogram()
        total.add(self.closed)
        total.add(self.current)
        return total

    def roll(self) -> None:
        # Swap instead of copying: the memory stays three histograms.
        self.closed.add(self.current)
        self.last, self.current = self.current, self.last
        self.current.clear()

    def summary(self) -> dict[str, Any]:
        return {"interval": self.last.summary(), "cumulative": self.cumulative.summary()}


def merged(windows: Iterable[Window]) -> Window:
    """A window counting every observation of `windows`: the all-groups figure, built when
    read (per /stats, /metrics or history sample) rather than observed on every ack."""
    total = Window()
    for window in windows:
        total.closed.add(window.closed)
        total.current.add(window.current)
        total.last.add(window.last)
    return total


class Latencies:
    """The broker's latency figures; `observe` is its `Events` observer.

    One `Window` per figure and per group that has acked a delivery (groups with a
    binding): bounded by the bindings, not the traffic. The figure over all groups
    (ALL_GROUPS) is their `merged` sum.
    """

    def __init__(self, clock: WallClock) -> None:
        self.clock = clock
        self.store = Window()
        self.end_to_end: dict[str, Window] = {}
        self.ack: dict[str, Window] = {}

    def observe(self, event: str, entity: MessageEntity, fields: dict[str, object]) -> None:
        """Only `stored` (with `store_ms`) and `acked` carry a latency (the broker subscribes
        it to those two); the rest pass."""
        if event == "acked":
            group = str(fields.get("group", ""))
            if group not in self.ack:
                self.ack[group] = Window()
                self.end_to_end[group] = Window()
            self.ack[group].observe(float(fields.get("latency_ms", 0.0)) / 1000)  # type: ignore[arg-type]
            if entity.created_at:
                self.end_to_end[group].observe(max(0.0, self.clock() - entity.created_at))
        elif event == "stored" and "store_ms" in fields:
            self.store.observe(float(fields["store_ms"]) / 1000)  # type: ignore[arg-type]

    def roll(self) -> dict[str, Any]:
        """Close the current interval of every figure (the history sampler calls it); its figures."""
        self.store.roll()
        for windows in (self.end_to_end, self.ack):
            for window in windows.values():
                window.roll()
        return self.interval()

    @staticmethod
    def groups(windows: dict[str, Window]) -> dict[str, Window]:
        """The per-group windows, sorted by group."""
        return {group: windows[group] for group in sorted(windows)}

    def snapshot(self) -> dict[str, Any]:
        """The `latency` object of /stats (milliseconds)."""
        return {
            "store": self.store.summary(),
            **{
                name: {
                    **merged(windows.values()).summary(),
                    "by_group": {group: window.summary() for group, window in self.groups(windows).items()},
                }
                for name, windows in (("end_to_end", self.end_to_end), ("ack", self.ack))
            },
        }

    def interval(self) -> dict[str, Any]:
        """The last closed interval's figures over all groups: what a history sample keeps."""
        return {
            "store": self.store.last.summary(),
            "end_to_end": merged(self.end_to_end.values()).last.summary(),
        }
