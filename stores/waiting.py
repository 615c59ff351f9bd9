"""Committed, live messages counted per key, with the oldest one's age: kept as they change.

The broker asks for these every second (`/stats`, `/metrics`), so a stats call must
cost O(distinct keys), never a walk over the messages. The memory store and the file
store's index key them by (topic, groups that have the message) and call `add` and
`remove` as messages enter and leave that state; MySQL answers the same question with
a GROUP BY instead.

The oldest created_at is kept to the whole second: one counter per distinct second
(at 10,000 messages a second that is one entry a second, not 10,000), and a heap of
those seconds with lazy deletion, so add and remove are O(log seconds).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Waiting:
    """Committed, live messages of one topic that exactly the `acked` groups have (sorted), and
    the oldest one's created_at (to the second for the file and memory stores)."""

    topic: str
    acked: tuple[str, ...]
    messages: int
    oldest: float


class _Ages:
    """The messages of one key: a count, a counter per created_at second, a heap of those seconds."""

    __slots__ = ("count", "heap", "seconds")

    def __init__(self) -> None:
        self.count = 0
        self.seconds: dict[int, int] = {}
        self.heap: list[int] = []

    def add(self, second: int) -> None:
        self.count += 1
        seconds = self.seconds
        n = seconds.get(second)
        if n is not None:
            seconds[second] = n + 1
            return
        seconds[second] = 1
        heap = self.heap
        heapq.heappush(heap, second)
        if len(heap) > 2 * len(seconds) + 16:  # seconds that emptied and came back: drop the stale copies
            self.heap = sorted(seconds)

    def remove(self, second: int) -> None:
        self.count -= 1
        seconds = self.seconds
        n = seconds[second] - 1
        if n:
            seconds[second] = n
        else:
            del seconds[second]

    def oldest(self) -> int:
        heap, seconds = self.heap, self.seconds
        while heap[0] not in seconds:
            heapq.heappop(heap)
        return heap[0]


def _second(created_at: float) -> int:
    return math.floor(created_at) if math.isfinite(created_at) else 0


class WaitingTracker(Generic[K]):
    """Counts and oldest created_at per key, under `add` and `remove` of single messages.

    A `remove` must match an earlier `add` of the same key and created_at (the caller
    tracks each message's state, as the stores do).
    """

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: dict[K, _Ages] = {}

    def add(self, key: K, created_at: float) -> None:
        ages = self._keys.get(key)
        if ages is None:
            ages = self._keys[key] = _Ages()
        ages.add(_second(created_at))

    def remove(self, key: K, created_at: float) -> None:
        ages = self._keys[key]
        ages.remove(_second(created_at))
        if not ages.count:
            del self._keys[key]

    def clear(self) -> None:
        self._keys.clear()

    def items(self) -> Iterator[tuple[K, int, float]]:
        """(key, messages, oldest created_at second) for every key with messages; O(keys)."""
        for key, ages in self._keys.items():
            yield key, ages.count, float(ages.oldest())


def summarize(found: Iterable[tuple[str, Iterable[str], int, float]]) -> list[Waiting]:
    """Rows per (topic, acked groups sorted), from (topic, acked, messages, oldest) parts: parts
    that differ only in fail groups or in the order of their groups fall together."""
    merged: dict[tuple[str, tuple[str, ...]], tuple[int, float]] = {}
    for topic, acked, messages, oldest in found:
        key = (topic, tuple(sorted(acked)))
        known = merged.get(key)
        merged[key] = (messages, oldest) if known is None else (known[0] + messages, min(known[1], oldest))
    return [Waiting(topic, acked, *counts) for (topic, acked), counts in sorted(merged.items())]
