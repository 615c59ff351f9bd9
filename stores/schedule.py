"""When committed messages fall due: the part of a store's index that page_due walks.

Shared by the file store's index and the memory store. Ids already due wait per topic
in id order (`due`); the others wait in buckets of a tenth of a second (`Timers`) until
`promote(now)` moves the buckets that came due. A page then costs O(log n + page) and
a message scheduled two years ahead costs nothing until its bucket comes up; a parked
topic's due ids are not even walked. Delayed messages (`kiteq.deliverAt`) and retries
after backoff are the same thing here: a next_deliver_at in the future.

`ScheduledCounts` keeps the figures /stats shows of delayed messages not yet delivered,
by topic and by the hour they fall due in, without a scan.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator
from typing import Generic, TypeVar

from protocol.schedule import deliver_at_of
from stores.entity import MessageEntity
from stores.sortedids import SortedIds

K = TypeVar("K", bound=Hashable)
H = TypeVar("H", bound=Hashable)

BUCKETS_PER_SECOND = 10
_BUCKET_RANGE = 1e14


def bucket(at: float) -> int:
    """Monotone in `at`: a bucket above bucket(now) holds nothing that is due at `now`."""
    if -_BUCKET_RANGE < at < _BUCKET_RANGE:
        return math.floor(at * BUCKETS_PER_SECOND)
    if at > 0 or at != at:  # far future, +inf and NaN (never due) share the last bucket
        return math.floor(_BUCKET_RANGE * BUCKETS_PER_SECOND)
    return math.floor(-_BUCKET_RANGE * BUCKETS_PER_SECOND)


class Timers:
    """Ids waiting for their next_deliver_at, by bucket; stale ids are dropped when popped."""

    __slots__ = ("_buckets", "_heap", "slots")

    def __init__(self) -> None:
        self._buckets: dict[int, list[str]] = {}
        self._heap: list[int] = []
        self.slots = 0

    def add(self, message_id: str, at: float) -> None:
        key = bucket(at)
        ids = self._buckets.get(key)
        if ids is None:
            self._buckets[key] = [message_id]
            heapq.heappush(self._heap, key)
        else:
            ids.append(message_id)
        self.slots += 1

    def pop_through(self, last: int) -> Iterator[tuple[int, list[str]]]:
        """Remove and yield every (bucket, ids) with bucket <= last."""
        while self._heap and self._heap[0] <= last:
            key = heapq.heappop(self._heap)
            ids = self._buckets.pop(key)
            self.slots -= len(ids)
            yield key, ids

    def first(self) -> int | None:
        """The earliest bucket holding ids (some may be stale)."""
        return self._heap[0] if self._heap else None

    def clear(self) -> None:
        self._buckets.clear()
        self._heap.clear()
        self.slots = 0


class Schedule(Generic[K]):
    """Committed, live ids by when they fall due; `K` is how the owner names a topic."""

    __slots__ = ("_partial", "due", "promoted", "timers")

    def __init__(self) -> None:
        self.due: dict[K, SortedIds] = {}
        self.timers = Timers()
        self.promoted = -math.inf  # the latest `now` promote saw
        self._partial = math.inf  # earliest time still waiting in the bucket of `promoted`

    def add(self, message_id: str, topic: K, at: float) -> None:
        if at <= self.promoted:
            self._due_of(topic).add(message_id)
        else:
            self._wait(message_id, at)

    def discard(self, message_id: str, topic: K) -> None:
        """Forget a due id; a waiting one goes stale in its bucket and is dropped when popped."""
        due = self.due.get(topic)
        if due is not None:
            due.discard(message_id)

    def rebuild(self, promoted: float, due: dict[K, list[str]], waiting: Iterable[tuple[str, float]]) -> None:
        """Replace everything at once (recovery): the ids due at `promoted` per topic, in any
        order, and (id, next_deliver_at) of the others."""
        self.promoted = promoted
        self.compact(waiting)
        self.due = {topic: SortedIds(ids) for topic, ids in due.items()}

    def tidy(self, stored: int, waiting: Callable[[], Iterable[tuple[str, float]]]) -> None:
        """Compact once the buckets hold far more ids than the owner's `stored` messages:
        rescheduling leaves stale ids behind. `waiting()` lists what still waits."""
        if self.timers.slots > 2 * stored + 4096:
            self.compact(waiting())

    def compact(self, waiting: Iterable[tuple[str, float]]) -> None:
        """Drop the stale ids rescheduling leaves in buckets: `waiting` is every (id, at) still
        waiting, at > promoted."""
        self.timers.clear()
        self._partial = math.inf
        for message_id, at in waiting:
            self._wait(message_id, at)

    def _wait(self, message_id: str, at: float) -> None:
        self.timers.add(message_id, at)
        if bucket(at) == bucket(self.promoted):
            self._partial = min(self._partial, at)

    def promote(self, now: float, state: Callable[[str], tuple[K, float] | None]) -> None:
        """Move every waiting id whose next_deliver_at <= now into `due`.

        `state(id)`: the id's (topic, next_deliver_at) if it is still committed and live,
        else None (an id that was rescheduled or removed is stale in its old bucket).
        """
        if not now > self.promoted:
            return
        moved: dict[K, list[str]] = {}
        keep = []
        for key, ids in self.timers.pop_through(bucket(now)):
            for message_id in ids:
                found = state(message_id)
                if found is None:
                    continue
                topic, at = found
                if at <= now:
                    moved.setdefault(topic, []).append(message_id)
                elif bucket(at) == key:
                    keep.append((message_id, at))
        self.promoted, self._partial = now, math.inf
        for message_id, at in keep:
            self._wait(message_id, at)
        for topic, ids in moved.items():
            self._due_of(topic).update(ids)

    def walk(self, after: str | None, passed: Collection[K]) -> Iterator[str]:
        """Due ids after the cursor `after`, in id order, of the topics not `passed`."""
        walks = [due.after(after) for topic, due in self.due.items() if topic not in passed and len(due)]
        return walks[0] if len(walks) == 1 else heapq.merge(*walks)

    def next_at(self) -> float | None:
        """When the earliest waiting id may fall due (never later; it may be a stale id)."""
        first = self.timers.first()
        if first is None:
            return None
        if first == bucket(self.promoted):
            return self._partial if self._partial != math.inf else (first + 1) / BUCKETS_PER_SECOND
        return first / BUCKETS_PER_SECOND

    def _due_of(self, topic: K) -> SortedIds:
        due = self.due.get(topic)
        if due is None:
            due = self.due[topic] = SortedIds()
        return due


def scheduled_at(entity: MessageEntity) -> float | None:
    """When a message asked to be delivered, if that was still ahead when it was stored.

    Such a message counts as scheduled (and may be cancelled) until its first delivery
    round is recorded. A value validation would refuse never reaches a store from the
    broker; from elsewhere it just means "not scheduled".
    """
    at = deliver_at_of(entity.properties)
    return at if at is not None and at > entity.created_at else None


HOUR = 3600


class ScheduledCounts(Generic[K]):
    """Scheduled messages not yet delivered, by topic and by the hour they fall due in."""

    __slots__ = ("by_hour", "by_topic")

    def __init__(self) -> None:
        self.by_topic: Counter[K] = Counter()
        self.by_hour: Counter[int] = Counter()  # hour start (Unix seconds) -> count

    def add(self, topic: K, at: float) -> None:
        self.by_topic[topic] += 1
        self.by_hour[int(at // HOUR) * HOUR] += 1

    def remove(self, topic: K, at: float) -> None:
        _decrement(self.by_topic, topic)
        _decrement(self.by_hour, int(at // HOUR) * HOUR)

    def clear(self) -> None:
        self.by_topic.clear()
        self.by_hour.clear()


def _decrement(counter: Counter[H], key: H) -> None:
    left = counter[key] - 1
    if left > 0:
        counter[key] = left
    else:
        del counter[key]
