"""The in-memory index: message id -> where its record is and its current state.

Memory is the constraint (a broker holding a million unfinished messages should
stay under ~300 MiB), so an entry is not an object but `ENTRY`-packed bytes (80
bytes with the object header, not tracked by the garbage collector), and the
strings it refers to (topic, dead reason, the (succ, fail) groups pair) are
numbers into `Interner` tables shared by every entry.

Beside the entries the index keeps what makes scans and stats cheap:

- `due`: per topic, ids of committed, live messages whose next_deliver_at <=
  `promoted` (the latest `now` page_due saw), in id order; `timers`: the other
  committed, live ids, bucketed by time. page_due moves the buckets that came due,
  then walks the due ids of the topics asked for from the cursor, so a page costs
  O(log n + page), not O(all messages), and a parked topic's backlog costs nothing.
- `uncommitted` and `dead`: id-ordered sets for their scans.
- counters for stats, and live entries per data segment for reclamation.

State transitions live here once (`apply`), used both by the store's calls and
by recovery's replay of the operation log.
"""

from __future__ import annotations

import heapq
import math
import struct
import sys
from collections import Counter
from collections.abc import Callable, Collection, Container, Hashable, Iterator
from typing import Generic, NamedTuple, TypeVar

from stores.entity import MessageEntity
from stores.errors import StoreError
from stores.file.messages import COMMIT, DEAD, NO_GROUPS, Head, check_i32
from stores.file.ops import Op
from stores.file.records import RecordType
from stores.sortedids import SortedIds

ENTRY = struct.Struct("<IIIddiIIHB")
STATE_FLAGS = COMMIT | DEAD
Groups = tuple[tuple[str, ...], tuple[str, ...]]
T = TypeVar("T", bound=Hashable)


class Entry(NamedTuple):
    segment: int
    offset: int
    length: int
    next_deliver_at: float
    created_at: float
    deliver_count: int
    topic: int
    groups: int
    reason: int
    flags: int

    def pack(self) -> bytes:
        return ENTRY.pack(*self)

    @property
    def committed_live(self) -> bool:
        return self.flags & STATE_FLAGS == COMMIT


def unpack(raw: bytes) -> Entry:
    return Entry._make(ENTRY.unpack(raw))


class Interner(Generic[T]):
    """Values numbered in order of first use; one shared object per distinct value."""

    __slots__ = ("limit", "name", "numbers", "values")

    def __init__(self, name: str, first: T, limit: int = 2**32 - 1) -> None:
        self.name = name
        self.limit = limit
        self.values: list[T] = []
        self.numbers: dict[T, int] = {}
        self.number(first)

    def number(self, value: T) -> int:
        found = self.numbers.get(value)
        if found is not None:
            return found
        if len(self.values) > self.limit:
            raise StoreError(
                f"more than {self.limit} distinct {self.name} values; the file store cannot index them"
            )
        value = _intern(value)
        found = self.numbers[value] = len(self.values)
        self.values.append(value)
        return found

    def __getitem__(self, number: int) -> T:
        return self.values[number]

    def load(self, values: list[T]) -> None:
        """Replace the table (a snapshot's tables keep their numbers)."""
        self.values = [_intern(value) for value in values]
        self.numbers = {value: i for i, value in enumerate(self.values)}


def _intern(value: T) -> T:
    """One object per distinct string, also inside (succ, fail) group tuples."""
    if isinstance(value, str):
        return sys.intern(value)  # type: ignore[return-value]
    if isinstance(value, tuple):
        return tuple(_intern(item) for item in value)  # type: ignore[return-value]
    return value


# Buckets of a tenth of a second: a page_due with a new `now` rescans at most one
# partly due bucket.
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

    def clear(self) -> None:
        self._buckets.clear()
        self._heap.clear()
        self.slots = 0


class Index:
    """Every stored message's location and state; see the module docstring."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}
        self.topics: Interner[str] = Interner("topic", "")
        self.reasons: Interner[str] = Interner("dead reason", "", limit=0xFFFF)
        self.groups: Interner[Groups] = Interner("group list", NO_GROUPS)
        self.segment_live: Counter[int] = Counter()
        self.emptied: list[int] = []
        self.due: dict[int, SortedIds] = {}  # topic number -> due ids
        self.uncommitted = SortedIds()
        self.dead = SortedIds()
        self.timers = Timers()
        self.promoted = -math.inf
        self.backlog: Counter[int] = Counter()
        self.dead_reasons: Counter[int] = Counter()
        # Recovery fills `entries` alone and calls rebuild(); live changes keep the rest in step.
        self.tracking = False

    # -- lookups --------------------------------------------------------------------------

    def get(self, message_id: str) -> Entry | None:
        raw = self.entries.get(message_id)
        return None if raw is None else unpack(raw)

    def __contains__(self, message_id: str) -> bool:
        return message_id in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def entry_for(self, head: Head, segment: int, offset: int, length: int) -> bytes:
        """The packed entry of a MESSAGE record read back by recovery."""
        topic = self.topics.numbers.get(head.topic)
        if topic is None:
            topic = self.topics.number(head.topic)
        return ENTRY.pack(
            segment,
            offset,
            length,
            head.next_deliver_at,
            head.created_at,
            head.deliver_count,
            topic,
            self.groups.number(head.groups) if head.groups is not NO_GROUPS else 0,
            self.reasons.number(head.dead_reason) if head.dead_reason else 0,
            head.flags & STATE_FLAGS,
        )

    def prepare(self, entity: MessageEntity) -> tuple[int, int, int, int]:
        """(topic, groups, reason, flags) numbers of a message about to be saved.

        Called before its record is reserved, so a value the index cannot hold fails
        the save before anything reaches the disk.
        """
        groups = 0
        if entity.succ_groups or entity.fail_groups:
            groups = self.groups.number((tuple(entity.succ_groups), tuple(entity.fail_groups)))
        reason = self.reasons.number(entity.dead_reason) if entity.dead_reason else 0
        flags = (COMMIT if entity.commit else 0) | (DEAD if entity.dead else 0)
        return self.topics.number(entity.topic), groups, reason, flags

    def add(
        self,
        message_id: str,
        segment: int,
        offset: int,
        length: int,
        entity: MessageEntity,
        prepared: tuple[int, int, int, int],
    ) -> None:
        """Index a message just saved (its id is new)."""
        topic, groups, reason, flags = prepared
        at = entity.next_deliver_at
        self.entries[message_id] = ENTRY.pack(
            segment, offset, length, at, entity.created_at, entity.deliver_count, topic, groups, reason, flags
        )
        if self.tracking:
            self._link(message_id, segment, flags, topic, reason, at)

    def apply_state(self, entity: MessageEntity, entry: Entry) -> MessageEntity:
        """Give `entity` (decoded from its record) the entry's current state."""
        entity.commit = bool(entry.flags & COMMIT)
        entity.dead = bool(entry.flags & DEAD)
        entity.dead_reason = self.reasons[entry.reason]
        entity.deliver_count = entry.deliver_count
        entity.next_deliver_at = entry.next_deliver_at
        entity.succ_groups, entity.fail_groups = self.groups[entry.groups]
        return entity

    # -- changes ----------------------------------------------------------------------------

    def put(self, message_id: str, entry: Entry) -> None:
        """Add or replace the entry of `message_id`."""
        old = self.entries.get(message_id)
        if self.tracking and old is not None:
            self._unlink(message_id, unpack(old))
        self.entries[message_id] = entry.pack()
        if self.tracking:
            self._link(
                message_id, entry.segment, entry.flags, entry.topic, entry.reason, entry.next_deliver_at
            )

    def remove(self, message_id: str, old: Entry | None = None) -> None:
        """Drop the entry of `message_id`; `old`: that entry, if the caller has it unpacked."""
        raw = self.entries.pop(message_id)
        if self.tracking:
            self._unlink(message_id, unpack(raw) if old is None else old)

    def apply(self, op: Op, *, check_location: bool = False, entry: Entry | None = None) -> tuple[bool, bool]:
        """Apply one state change: (accepted, changed).

        `accepted` is the store call's answer; `changed` says whether anything must be
        logged. Replay passes `check_location` so an op applies only to the record
        it was written for. `entry`: the op's entry, if the caller just looked it up.
        """
        if entry is None:
            entry = self.get(op.message_id)
        if entry is None:
            return False, False
        if check_location and (entry.segment, entry.offset) != (op.segment, op.offset):
            return False, False
        kind, flags = op.rtype, entry.flags
        new: Entry | None
        if kind is RecordType.COMMIT:
            if flags & COMMIT:
                return True, False
            new = entry._replace(flags=flags | COMMIT, deliver_count=0, next_deliver_at=0.0)
        elif kind is RecordType.ROLLBACK:
            if flags & COMMIT:
                return False, False
            new = None
        elif kind is RecordType.DELIVERY:
            new = entry._replace(
                deliver_count=check_i32("deliver_count", op.deliver_count),
                next_deliver_at=op.next_deliver_at,
                groups=self.groups.number(op.groups),
            )
        elif kind is RecordType.FINISH:
            new = None
        elif kind is RecordType.DEAD:
            new = entry._replace(flags=flags | DEAD, reason=self.reasons.number(op.reason))
        elif kind is RecordType.REDRIVE:
            if not flags & DEAD:
                return False, False
            succ = self.groups[entry.groups][0]
            new = entry._replace(
                flags=(flags | COMMIT) & ~DEAD,
                reason=0,
                deliver_count=0,
                next_deliver_at=0.0,
                groups=self.groups.number((succ, ())),
            )
        elif kind is RecordType.PURGE:
            if not flags & DEAD:
                return False, False
            new = None
        else:
            raise ValueError(f"{kind!r} is not a state change")
        if new is None:
            self.remove(op.message_id, entry)
        elif new != entry:
            self.put(op.message_id, new)
        else:
            return True, False
        return True, True

    # -- derived structures -----------------------------------------------------------------

    def _link(self, message_id: str, segment: int, flags: int, topic: int, reason: int, at: float) -> None:
        live = self.segment_live
        live[segment] = live.get(segment, 0) + 1
        if flags & DEAD:
            self.dead.add(message_id)
            self.dead_reasons[reason] += 1
        elif not flags & COMMIT:
            self.uncommitted.add(message_id)
        else:
            backlog = self.backlog
            backlog[topic] = backlog.get(topic, 0) + 1
            if at <= self.promoted:
                self._due_of(topic).add(message_id)
            else:
                self._wait(message_id, at)

    def _due_of(self, topic: int) -> SortedIds:
        due = self.due.get(topic)
        if due is None:
            due = self.due[topic] = SortedIds()
        return due

    def _unlink(self, message_id: str, entry: Entry) -> None:
        _decrement(self.segment_live, entry.segment)
        if entry.segment not in self.segment_live:
            self.emptied.append(entry.segment)
        flags = entry.flags
        if flags & DEAD:
            self.dead.discard(message_id)
            _decrement(self.dead_reasons, entry.reason)
        elif not flags & COMMIT:
            self.uncommitted.discard(message_id)
        else:
            _decrement(self.backlog, entry.topic)
            due = self.due.get(entry.topic)
            if due is not None:
                due.discard(message_id)

    def _wait(self, message_id: str, at: float) -> None:
        self.timers.add(message_id, at)
        if self.timers.slots > 2 * len(self.entries) + 4096:
            self._rebuild_timers()

    def _rebuild_timers(self) -> None:
        """Drop the stale ids that rescheduling leaves behind in old buckets."""
        self.timers.clear()
        for message_id, raw in self.entries.items():
            entry = unpack(raw)
            if entry.committed_live and entry.next_deliver_at > self.promoted:
                self.timers.add(message_id, entry.next_deliver_at)

    def rebuild(self, promoted: float) -> None:
        """Derive every structure from `entries` in one pass (after recovery), then track changes."""
        self.segment_live.clear()
        self.backlog.clear()
        self.dead_reasons.clear()
        self.timers.clear()
        self.promoted = promoted
        due: dict[int, list[str]] = {}
        uncommitted, dead = [], []
        live, backlog, unpack_raw, wait = self.segment_live, self.backlog, ENTRY.unpack, self.timers.add
        for message_id, raw in self.entries.items():
            segment, _, _, at, _, _, topic, _, reason, flags = unpack_raw(raw)
            live[segment] = live.get(segment, 0) + 1
            if flags & DEAD:
                dead.append(message_id)
                self.dead_reasons[reason] += 1
            elif not flags & COMMIT:
                uncommitted.append(message_id)
            else:
                backlog[topic] = backlog.get(topic, 0) + 1
                if at <= promoted:
                    due.setdefault(topic, []).append(message_id)
                else:
                    wait(message_id, at)
        self.due = {topic: SortedIds(ids) for topic, ids in due.items()}
        self.uncommitted.rebuild(uncommitted)
        self.dead.rebuild(dead)
        self.emptied.clear()
        self.tracking = True

    # -- scans ------------------------------------------------------------------------------

    def promote(self, now: float) -> None:
        """Move every waiting id with next_deliver_at <= now into `due`."""
        if not now > self.promoted:
            return
        moved: dict[int, list[str]] = {}
        keep = []
        entries = self.entries
        for key, ids in self.timers.pop_through(bucket(now)):
            for message_id in ids:
                raw = entries.get(message_id)
                if raw is None:
                    continue
                entry = unpack(raw)
                if not entry.committed_live:
                    continue
                at = entry.next_deliver_at
                if at <= now:
                    moved.setdefault(entry.topic, []).append(message_id)
                elif bucket(at) == key:
                    keep.append((message_id, at))
        for message_id, at in keep:
            self.timers.add(message_id, at)
        self.promoted = now
        for topic, ids in moved.items():
            self._due_of(topic).update(ids)

    def page_due(
        self, now: float, after: str | None, limit: int, skip: Container[str], parked: Collection[str] = ()
    ) -> list[str]:
        """Up to `limit` ids of committed, live messages due at `now`, after `after`, not in `skip`,
        of topics not `parked` (whose due ids are not even walked)."""
        self.promote(now)
        passed = {number for topic in parked if (number := self.topics.numbers.get(topic)) is not None}
        walks = [due.after(after) for topic, due in self.due.items() if topic not in passed and len(due)]
        merged = walks[0] if len(walks) == 1 else heapq.merge(*walks)
        ids = (message_id for message_id in merged if message_id not in skip)
        return self._take(ids, limit, lambda entry: entry.next_deliver_at <= now)

    def page_uncommitted(self, older_than: float, after: str | None, limit: int) -> list[str]:
        return self._take(self.uncommitted.after(after), limit, lambda entry: entry.created_at <= older_than)

    def page_dead(self, after: str | None, limit: int) -> list[str]:
        return self._take(self.dead.after(after), limit, None)

    def _take(self, ids: Iterator[str], limit: int, wanted: Callable[[Entry], bool] | None) -> list[str]:
        """The first `limit` of `ids` whose entry is `wanted` (every one for None)."""
        entries = self.entries
        found = []
        for message_id in ids:
            if wanted is None or wanted(unpack(entries[message_id])):
                found.append(message_id)
                if len(found) == limit:
                    break
        return found

    # -- counts -----------------------------------------------------------------------------

    def counts(self) -> tuple[int, int, int, dict[str, int], dict[str, int]]:
        """(live, uncommitted, dead, dead by reason, committed backlog by topic)."""
        dead = len(self.dead)
        return (
            len(self.entries) - dead,
            len(self.uncommitted),
            dead,
            {self.reasons[r]: n for r, n in self.dead_reasons.items()},
            {self.topics[t]: n for t, n in self.backlog.items()},
        )


def _decrement(counter: Counter[int], key: int) -> None:
    left = counter[key] - 1
    if left:
        counter[key] = left
    else:
        del counter[key]
