"""The in-memory index: message id -> where its record is and its current state.

Memory is the constraint (a broker holding a million unfinished messages should
stay under ~300 MiB), so an entry is not an object but `ENTRY`-packed bytes (80
bytes with the object header, not tracked by the garbage collector), and the
strings it refers to (topic, dead reason, the (succ, fail) groups pair) are
numbers into `Interner` tables shared by every entry.

Beside the entries the index keeps what makes scans and stats cheap:

- `schedule` (stores.schedule): per topic, ids of committed, live messages already
  due, in id order, and the others bucketed by time. A page first promotes the
  buckets that came due, then walks the due ids of the topics asked for from the
  cursor, so a page costs O(log n + page), not O(all messages); a parked topic is
  neither promoted nor walked, so its backlog costs nothing until it is unparked.
- `uncommitted` and `dead`: id-ordered sets for their scans.
- counters for stats, and live entries per data segment for reclamation.

State transitions live here once (`apply`), used both by the store's calls and
by recovery's replay of the operation log.
"""

from __future__ import annotations

import math
import struct
import sys
from collections import Counter
from collections.abc import Callable, Collection, Container, Hashable, Iterable, Iterator
from typing import Generic, NamedTuple, TypeVar

from stores.base import Stage, stage_walk
from stores.entity import MessageEntity
from stores.errors import StoreError
from stores.file.messages import COMMIT, DEAD, NO_GROUPS, SCHEDULED, Head, check_i32, decode_head
from stores.file.ops import Op
from stores.file.records import RecordType
from stores.schedule import Schedule, ScheduledCounts
from stores.sortedids import SortedIds
from stores.waiting import Waiting, WaitingTracker, summarize

ENTRY = struct.Struct("<IIIddiIIHB")
STATE_FLAGS = COMMIT | DEAD
# What an entry keeps of a record's flags: its state, and whether it was scheduled (and not yet delivered).
ENTRY_FLAGS = STATE_FLAGS | SCHEDULED
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


# Single fields read straight from a packed entry: the paging walks ask one field of every
# id they pass, and unpacking all ten into an Entry was the larger part of a page's cost.
_LOCATION = struct.Struct("<III")  # segment, offset, length: the entry's first fields
_LOCATED = struct.calcsize("<II")  # the bytes that say which record (segment, offset)
_TIME = struct.Struct("<d")
_NEXT_DELIVER_AT = struct.calcsize("<III")
_CREATED_AT = struct.calcsize("<IIId")
_TOPIC = struct.Struct("<I")
_TOPIC_AT = struct.calcsize("<IIIddi")


def location(raw: bytes) -> tuple[int, int, int]:
    """(segment, offset, length) of a packed entry's record."""
    return _LOCATION.unpack_from(raw)


def same_record(raw: bytes, other: bytes) -> bool:
    """Whether two packed entries point at the same record (their state may differ)."""
    return raw is other or raw[:_LOCATED] == other[:_LOCATED]


def due_at(raw: bytes) -> float:
    (at,) = _TIME.unpack_from(raw, _NEXT_DELIVER_AT)
    return float(at)


def created_at(raw: bytes) -> float:
    (at,) = _TIME.unpack_from(raw, _CREATED_AT)
    return float(at)


def topic_of(raw: bytes) -> int:
    (topic,) = _TOPIC.unpack_from(raw, _TOPIC_AT)
    return int(topic)


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
        # str(): a str subclass (a StrEnum reason, say) is stored as its plain text.
        return sys.intern(str(value))  # type: ignore[return-value]
    if isinstance(value, tuple):
        return tuple(_intern(item) for item in value)  # type: ignore[return-value]
    return value


class Index:
    """Every stored message's location and state; see the module docstring."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}
        self.topics: Interner[str] = Interner("topic", "")
        self.reasons: Interner[str] = Interner("dead reason", "", limit=0xFFFF)
        self.groups: Interner[Groups] = Interner("group list", NO_GROUPS)
        self.segment_live: Counter[int] = Counter()
        self.emptied: list[int] = []
        self.schedule: Schedule[int] = Schedule()  # committed, live ids by when due; topic numbers
        self.scheduled: ScheduledCounts[int] = ScheduledCounts()
        self.committed: dict[int, SortedIds] = {}  # topic number -> committed, live ids (browsing)
        self.uncommitted = SortedIds()
        self.dead = SortedIds()
        self.backlog: Counter[int] = Counter()
        self.waiting: WaitingTracker[tuple[int, int]] = WaitingTracker()  # (topic, groups) numbers
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

    def recover_record(
        self,
        data: bytes,
        head_start: int,
        segment: int,
        offset: int,
        length: int,
        trusted_below: tuple[int, int],
    ) -> None:
        """Index a MESSAGE record read back by recovery, from its segment or the segment's
        summary: its payload's head starts at `head_start` in `data`. Below `trusted_below`
        (a damaged snapshot's mark), a snapshot's entry for the id has the record's later
        state and is kept."""
        head = decode_head(data, head_start)
        entries = self.entries
        if (segment, offset) < trusted_below and head.message_id in entries:
            return
        entries[head.message_id] = self.entry_for(head, segment, offset, length)

    def recover_records(
        self,
        found: list[tuple[int, int, bytes, int]],
        segment: int,
        start: int,
        trusted_below: tuple[int, int],
    ) -> int:
        """`recover_record` each (offset, length, data, head start) of a summary from offset
        `start` on; how many."""
        count = 0
        for offset, length, data, head_start in found:
            if offset >= start:
                self.recover_record(data, head_start, segment, offset, length, trusted_below)
                count += 1
        return count

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
            head.flags & ENTRY_FLAGS,
        )

    def prepare(self, entity: MessageEntity, record_flags: int) -> tuple[int, int, int, int]:
        """(topic, groups, reason, flags) numbers of a message about to be saved.

        Called before its record is reserved, so a value the index cannot hold fails
        the save before anything reaches the disk. `record_flags`: its MESSAGE record's;
        the entry keeps ENTRY_FLAGS of them, as recovery does (`entry_for`).
        """
        groups = 0
        if entity.succ_groups or entity.fail_groups:
            groups = self.groups.number((tuple(entity.succ_groups), tuple(entity.fail_groups)))
        reason = self.reasons.number(entity.dead_reason) if entity.dead_reason else 0
        return self.topics.number(entity.topic), groups, reason, record_flags & ENTRY_FLAGS

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
            self._link(message_id, segment, flags, topic, reason, at, groups, entity.created_at)

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
        # A delivery round leaves a message committed, live and of its topic: its place in the
        # browsing set stays (a move there costs a few µs on the delivery path).
        listed = False
        if self.tracking and old is not None:
            was = unpack(old)
            listed = was.committed_live and entry.committed_live and was.topic == entry.topic
            self._unlink(message_id, was, listed=listed)
        self.entries[message_id] = entry.pack()
        if self.tracking:
            self._link(
                message_id,
                entry.segment,
                entry.flags,
                entry.topic,
                entry.reason,
                entry.next_deliver_at,
                entry.groups,
                entry.created_at,
                listed=listed,
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
            new = entry._replace(flags=flags | COMMIT, deliver_count=0, next_deliver_at=op.next_deliver_at)
        elif kind is RecordType.ROLLBACK:
            if flags & COMMIT:
                return False, False
            new = None
        elif kind is RecordType.DELIVERY:
            new = entry._replace(
                deliver_count=check_i32("deliver_count", op.deliver_count),
                next_deliver_at=op.next_deliver_at,
                groups=self.groups.number(op.groups),
                # A committed message's first recorded round ends its being scheduled.
                flags=flags & ~SCHEDULED if flags & COMMIT else flags,
            )
        elif kind is RecordType.CANCEL:
            if not flags & SCHEDULED or flags & DEAD:
                return False, False
            new = None
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

    def _link(
        self,
        message_id: str,
        segment: int,
        flags: int,
        topic: int,
        reason: int,
        at: float,
        groups: int,
        created_at: float,
        *,
        listed: bool = False,
    ) -> None:
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
            self.waiting.add((topic, groups), created_at)
            if not listed:
                _ids_of(self.committed, topic).add(message_id)
            if flags & SCHEDULED:
                self.scheduled.add(topic, at)
            self.schedule.add(message_id, topic, at)
            self.schedule.tidy(len(self.entries), self._live_times)

    def _unlink(self, message_id: str, entry: Entry, *, listed: bool = False) -> None:
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
            self.waiting.remove((entry.topic, entry.groups), entry.created_at)
            if not listed:
                self.committed[entry.topic].discard(message_id)
            if flags & SCHEDULED:
                self.scheduled.remove(entry.topic, entry.next_deliver_at)
            self.schedule.discard(message_id, entry.topic)

    def _live_times(self) -> Iterator[tuple[str, int, float]]:
        """(id, topic, next_deliver_at) of every committed, live message."""
        for message_id, raw in self.entries.items():
            entry = unpack(raw)
            if entry.committed_live:
                yield message_id, entry.topic, entry.next_deliver_at

    def _due_at(self, message_id: str) -> float | None:
        """next_deliver_at of a committed, live message; None for any other id."""
        raw = self.entries.get(message_id)
        if raw is None:
            return None
        # Unpacked to a plain tuple: a promotion asks this of every id that came due.
        _, _, _, at, _, _, _, _, _, flags = ENTRY.unpack(raw)
        return at if flags & STATE_FLAGS == COMMIT else None

    def rebuild(self, promoted: float) -> None:
        """Derive every structure from `entries` in one pass (after recovery), then track changes."""
        self.segment_live.clear()
        self.backlog.clear()
        self.waiting.clear()
        self.dead_reasons.clear()
        self.scheduled.clear()
        due: dict[int, list[str]] = {}
        waiting: list[tuple[str, int, float]] = []
        committed: dict[int, list[str]] = {}
        uncommitted, dead = [], []
        live, backlog, unpack_raw, wait = self.segment_live, self.backlog, ENTRY.unpack, waiting.append
        scheduled = self.scheduled.add
        track_waiting = self.waiting.add
        for message_id, raw in self.entries.items():
            segment, _, _, at, created_at, _, topic, groups, reason, flags = unpack_raw(raw)
            live[segment] = live.get(segment, 0) + 1
            if flags & DEAD:
                dead.append(message_id)
                self.dead_reasons[reason] += 1
            elif not flags & COMMIT:
                uncommitted.append(message_id)
            else:
                backlog[topic] = backlog.get(topic, 0) + 1
                track_waiting((topic, groups), created_at)
                committed.setdefault(topic, []).append(message_id)
                if flags & SCHEDULED:
                    scheduled(topic, at)
                if at <= promoted:
                    due.setdefault(topic, []).append(message_id)
                else:
                    wait((message_id, topic, at))
        self.schedule.rebuild(promoted, due, waiting)
        self.committed = {topic: SortedIds(ids) for topic, ids in committed.items()}
        self.uncommitted.rebuild(uncommitted)
        self.dead.rebuild(dead)
        self.emptied.clear()
        self.tracking = True

    # -- scans ------------------------------------------------------------------------------

    def promote(self, now: float, parked: Collection[str] = (), limit: float = math.inf) -> bool:
        """Move waiting ids with next_deliver_at <= now into the due sets, but not a `parked`
        topic's; False if `limit` ids were looked at first (see Schedule.promote)."""
        return self.schedule.promote(now, self._due_at, self._numbers(parked), limit)

    def page_due(
        self, now: float, after: str | None, limit: int, skip: Container[str], parked: Collection[str] = ()
    ) -> list[str]:
        """Up to `limit` ids of committed, live messages due at `now` (as far as they were
        promoted), after `after`, not in `skip`, of topics not `parked` (not even walked)."""
        ids = _not_in(self.schedule.walk(after, self._numbers(parked)), skip)
        return self._take(ids, limit, lambda raw: due_at(raw) <= now)

    def _numbers(self, topics: Collection[str]) -> set[int]:
        return {number for topic in topics if (number := self.topics.numbers.get(topic)) is not None}

    def page_uncommitted(self, older_than: float, after: str | None, limit: int) -> list[str]:
        return self._take(self.uncommitted.after(after), limit, lambda raw: created_at(raw) <= older_than)

    def page_dead(self, after: str | None, limit: int) -> list[str]:
        return self._take(self.dead.after(after), limit, None)

    def page_messages(self, after: str | None, limit: int, topic: str, stage: Stage | None) -> list[str]:
        """Up to `limit` ids after `after` in id order, of `topic` and `stage` when given."""
        number = self.topics.numbers.get(topic) if topic else None
        if topic and number is None:
            return []
        ids = stage_walk(self.committed, self.uncommitted, self.dead, after, stage, number)
        wanted = None if number is None else (lambda raw: topic_of(raw) == number)
        return self._take(ids, limit, wanted)

    def _take(self, ids: Iterator[str], limit: int, wanted: Callable[[bytes], bool] | None) -> list[str]:
        """The first `limit` of `ids` whose packed entry is `wanted` (every one for None)."""
        entries = self.entries
        found = []
        for message_id in ids:
            if wanted is None or wanted(entries[message_id]):
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

    def scheduled_by_topic(self) -> dict[str, int]:
        return {self.topics[t]: n for t, n in self.scheduled.by_topic.items()}

    def waiting_by_topic(self) -> list[Waiting]:
        """Committed, live messages per topic and acked groups, with the oldest: O(distinct pairs)."""
        topics, groups = self.topics, self.groups
        return summarize(
            (topics[topic], groups[pair][0], n, oldest) for (topic, pair), n, oldest in self.waiting.items()
        )


def _not_in(ids: Iterable[str], skip: Container[str]) -> Iterator[str]:
    """The walk's ids not in `skip`, lazily: a generator function, because mypyc builds a
    generator expression's whole list first, and the walk can cover the whole backlog."""
    for message_id in ids:
        if message_id not in skip:
            yield message_id


def _ids_of(sets: dict[int, SortedIds], topic: int) -> SortedIds:
    ids = sets.get(topic)
    if ids is None:
        ids = sets[topic] = SortedIds()
    return ids


def _decrement(counter: Counter[int], key: int) -> None:
    left = counter[key] - 1
    if left:
        counter[key] = left
    else:
        del counter[key]
