"""When committed messages fall due: the part of a store's index that page_due walks.

Shared by the file store's index and the memory store. Ids already due wait per topic
in id order (`due`); the others wait in buckets of a tenth of a second (`Timers`) until
`promote(now)` moves the buckets that came due. A page then costs O(log n + page) and
a message scheduled two years ahead costs nothing until its bucket comes up; a parked
topic is neither promoted nor walked until it is unparked. Delayed messages (`kiteq.deliverAt`) and retries
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
# Ids a promotion looks at before the store lets other tasks run: a topic unparked with a
# million messages waiting is promoted in steps of a few milliseconds, not in one block.
PROMOTE_STEP = 4096
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

    def pop_first(self) -> tuple[int, list[str]]:
        """Remove and return the earliest (bucket, ids)."""
        key = heapq.heappop(self._heap)
        ids = self._buckets.pop(key)
        self.slots -= len(ids)
        return key, ids

    def first(self) -> int | None:
        """The earliest bucket holding ids (some may be stale)."""
        return self._heap[0] if self._heap else None

    def clear(self) -> None:
        self._buckets.clear()
        self._heap.clear()
        self.slots = 0


class TopicSchedule:
    """One topic's committed, live ids: those due, in id order, and those waiting, by bucket."""

    __slots__ = ("due", "partial", "promoted", "timers")

    def __init__(self, promoted: float) -> None:
        self.due = SortedIds()
        self.timers = Timers()
        self.promoted = promoted  # every id with next_deliver_at <= this is in `due` (or gone)
        self.partial = math.inf  # earliest time still waiting in the bucket of `promoted`

    def wait(self, message_id: str, at: float) -> None:
        self.timers.add(message_id, at)
        if bucket(at) == bucket(self.promoted):
            self.partial = min(self.partial, at)

    def promote(self, now: float, due_at: Callable[[str], float | None], budget: float) -> int:
        """Move waiting ids with next_deliver_at <= now into `due`, a whole bucket at a time,
        until `budget` ids were looked at; the number looked at. `promoted` reaches `now`
        only when every bucket through now was taken."""
        if not now > self.promoted:
            return 0
        last, looked, key = bucket(now), 0, None
        moved: list[str] = []
        keep = []
        while looked < budget and (first := self.timers.first()) is not None and first <= last:
            key, ids = self.timers.pop_first()
            looked += len(ids)
            for message_id in ids:
                at = due_at(message_id)
                if at is None:
                    continue
                if at <= now:
                    moved.append(message_id)
                elif bucket(at) == key:
                    keep.append((message_id, at))
        first = self.timers.first()
        if first is None or first > last:
            self.promoted = now
        elif key is not None:
            # Stopped early: every bucket through `key` was taken whole.
            self.promoted = max(self.promoted, key / BUCKETS_PER_SECOND)
        self.partial = math.inf
        for message_id, at in keep:
            self.wait(message_id, at)
        self.due.update(moved)
        return looked

    def next_at(self) -> float | None:
        """When the earliest waiting id may fall due (never later; it may be a stale id)."""
        first = self.timers.first()
        if first is None:
            return None
        if first == bucket(self.promoted):
            return self.partial if self.partial != math.inf else (first + 1) / BUCKETS_PER_SECOND
        return first / BUCKETS_PER_SECOND


class Schedule(Generic[K]):
    """Committed, live ids by when they fall due, per topic; `K` is how the owner names a topic.

    Kept per topic so that a parked topic (nobody online to deliver to) costs nothing
    while it is parked: `promote` and `next_at` pass over it, so its waiting ids are
    neither moved nor woken for, however many arrive. When it is unparked, its buckets
    are promoted like any other's, in steps of `promote`'s `limit` ids.
    """

    __slots__ = ("parked", "promoted", "slots", "topics")

    def __init__(self) -> None:
        self.topics: dict[K, TopicSchedule] = {}
        self.promoted = -math.inf  # the latest `now` promote saw: where a new topic starts
        self.parked: Collection[K] = ()  # what the last promote passed over
        self.slots = 0  # ids in every topic's buckets, stale ones included

    def add(self, message_id: str, topic: K, at: float) -> None:
        schedule = self._of(topic)
        if at <= schedule.promoted:
            schedule.due.add(message_id)
        else:
            schedule.wait(message_id, at)
            self.slots += 1

    def discard(self, message_id: str, topic: K) -> None:
        """Forget a due id; a waiting one goes stale in its bucket and is dropped when popped."""
        schedule = self.topics.get(topic)
        if schedule is not None:
            schedule.due.discard(message_id)

    def rebuild(
        self, promoted: float, due: dict[K, list[str]], waiting: Iterable[tuple[str, K, float]]
    ) -> None:
        """Replace everything at once (recovery): the ids due at `promoted` per topic, in any
        order, and (id, topic, next_deliver_at) of the others."""
        self.promoted = promoted
        self.topics = {}
        for topic, ids in due.items():
            self._of(topic).due.rebuild(ids)
        self.compact(waiting)

    def tidy(self, stored: int, live: Callable[[], Iterable[tuple[str, K, float]]]) -> None:
        """Compact once the buckets hold far more ids than the owner's `stored` messages:
        rescheduling leaves stale ids behind. `live()` lists every committed, live
        (id, topic, next_deliver_at)."""
        if self.slots > 2 * stored + 4096:
            self.compact(live())

    def compact(self, live: Iterable[tuple[str, K, float]]) -> None:
        """Drop the stale ids rescheduling leaves in buckets: `live` is every committed, live
        (id, topic, next_deliver_at); those past their topic's promotion are already due."""
        for schedule in self.topics.values():
            schedule.timers.clear()
            schedule.partial = math.inf
        self.slots = 0
        for message_id, topic, at in live:
            schedule = self._of(topic)
            if at > schedule.promoted:
                schedule.wait(message_id, at)
                self.slots += 1

    def promote(
        self,
        now: float,
        due_at: Callable[[str], float | None],
        parked: Collection[K] = (),
        limit: float = math.inf,
    ) -> bool:
        """Move waiting ids whose next_deliver_at <= now into their topic's due ids, except
        the `parked` topics'; True once done, False when `limit` ids were looked at first
        (call again: each call goes on where the last stopped).

        `due_at(id)`: the id's next_deliver_at if it is still committed and live, else None
        (an id that was rescheduled or removed is stale in its old bucket).
        """
        self.promoted = max(self.promoted, now)
        self.parked = frozenset(parked)
        budget = limit
        for topic, schedule in self.topics.items():
            if topic in parked or not now > schedule.promoted:
                continue
            before = schedule.timers.slots
            budget -= schedule.promote(now, due_at, budget)
            self.slots += schedule.timers.slots - before
            if schedule.promoted < now:  # it stopped for the limit
                return False
        return True

    def walk(self, after: str | None, passed: Collection[K]) -> Iterator[str]:
        """Due ids after the cursor `after`, in id order, of the topics not `passed`."""
        walks = [s.due.after(after) for topic, s in self.topics.items() if topic not in passed and len(s.due)]
        return walks[0] if len(walks) == 1 else heapq.merge(*walks)

    def next_at(self) -> float | None:
        """When the earliest waiting id of a topic not parked may fall due (never later)."""
        times = [
            at
            for topic, schedule in self.topics.items()
            if topic not in self.parked and (at := schedule.next_at()) is not None
        ]
        return min(times, default=None)

    def _of(self, topic: K) -> TopicSchedule:
        schedule = self.topics.get(topic)
        if schedule is None:
            schedule = self.topics[topic] = TopicSchedule(self.promoted)
        return schedule


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
