"""The interface every message store implements, and its small value types.

Contract (checked by tests/contract/, which every store passes unchanged):

- `save` returns only when the message is as durable as the store promises
  (memory: not at all; file: per its fsync mode; mysql: committed on the master).
  Saving an id that is already stored changes nothing and returns False.
- State changes on an unknown id are no-ops that return False (or None), never errors:
  a message may have been finished or rolled back by a racing decision.
- A rolled-back message is gone: a later `commit` of it returns False.
- `page_*` calls (limit >= 1) return at most `limit` entities in a stable order and a cursor; pass
  the cursor back as `after` for the next page; a None cursor means the end.
  Paged entities are complete (body included): the broker delivers straight
  from a page.
- All methods are Trio-async and safe to call from many tasks at once.
"""

from __future__ import annotations

import heapq
from abc import abstractmethod
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Container,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TypeVar

import trio

from stores.entity import MessageEntity
from stores.errors import StoreError
from stores.resource import AsyncResource
from stores.sortedids import SortedIds
from stores.waiting import Waiting

Cursor = str
T = TypeVar("T")
K = TypeVar("K")  # a topic key: its name, or the number a store gives it


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message to dead-letter, and the truth about it at that moment."""

    message_id: str
    reason: str
    deliver_count: int
    succ_groups: tuple[str, ...]
    fail_groups: tuple[str, ...]
    at: float  # when it was dead-lettered: kept as the dead letter's next_deliver_at


@dataclass(frozen=True, slots=True)
class DeliveryUpdate:
    """A delivery round's outcome to record: `update_delivery`'s arguments, for `update_delivery_many`."""

    message_id: str
    succ_groups: tuple[str, ...]
    fail_groups: tuple[str, ...]
    deliver_count: int
    next_deliver_at: float


class Stage(StrEnum):
    """Where a stored message is in its life, as `page_messages` selects it."""

    UNCOMMITTED = "uncommitted"
    COMMITTED = "committed"  # and live: waiting for delivery or being delivered
    DEAD = "dead"

    @classmethod
    def of(cls, entity: MessageEntity) -> Stage:
        if entity.dead:
            return cls.DEAD
        return cls.COMMITTED if entity.commit else cls.UNCOMMITTED


def stage_walk(
    committed: Mapping[K, SortedIds],
    uncommitted: SortedIds,
    dead: SortedIds,
    after: str | None,
    stage: Stage | None,
    topic: K | None,
) -> Iterator[str]:
    """Stored ids after `after` in id order, of `stage` (every stage for None), for `page_messages`.

    `committed` holds the committed, live ids per topic key: only `topic`'s are walked (every
    topic's for None). Uncommitted and dead ids are not kept per topic: the caller filters them.
    """
    walks = []
    if stage in (None, Stage.COMMITTED):
        walks += [ids.after(after) for key, ids in committed.items() if topic in (None, key) and len(ids)]
    if stage in (None, Stage.UNCOMMITTED):
        walks.append(uncommitted.after(after))
    if stage in (None, Stage.DEAD):
        walks.append(dead.after(after))
    return heapq.merge(*walks)


def nothing_coming() -> bool:
    """The default `busy` of `Staged.durable`: no more work on its way."""
    return False


class Durable(Protocol):
    """How to wait until a `Staged`'s messages are durable."""

    def __call__(
        self, *, busy: Callable[[], bool] = nothing_coming, trickling: bool = False
    ) -> Awaitable[None]: ...


@dataclass(frozen=True, slots=True)
class Staged:
    """Messages handed to a store: which were new, and how to wait until they are durable
    (`durable()` yields only if it has to wait: a producer's store-ack pays for every turn
    of the event loop).

    `durable(busy=...)`: `busy`, asked when the store would write them on the event
    loop's thread, says whether more work is on its way there (their sender has other
    messages in flight); if so, the store writes them elsewhere (the file store's
    writer thread), since the loop would otherwise hold that work up for a sync.
    `trickling=True`: that sender sends its messages spaced out (a few to a read), so the
    store may instead hold the save a moment for the next ones to share its sync (the
    file store, GATHER_DELAY), and then write them all on the loop's thread.
    """

    saved: list[bool]
    durable: Durable


async def _already_durable(*, busy: Callable[[], bool] = nothing_coming, trickling: bool = False) -> None:
    """Nothing to wait for: `save_many` stored them durably already."""


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a scan; `cursor` is None once the scan is complete."""

    items: list[MessageEntity]
    cursor: Cursor | None


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts every store can report cheaply; `details` holds store-specific figures."""

    kind: str
    messages: int
    uncommitted: int
    dead: int
    dead_by_reason: dict[str, int] = field(default_factory=dict)
    backlog_by_topic: dict[str, int] = field(default_factory=dict)
    # Scheduled messages not yet delivered (part of the backlog): by topic, and by the
    # hour they fall due in (its start, Unix seconds).
    scheduled_by_topic: dict[str, int] = field(default_factory=dict)
    scheduled_by_hour: dict[int, int] = field(default_factory=dict)
    # Committed, live messages per topic and the groups that acked them, with the oldest
    # one's created_at: what each group still waits for, counted without a scan.
    waiting: list[Waiting] = field(default_factory=list)
    details: dict[str, object] = field(default_factory=dict)


class MessageStore(AsyncResource):
    """Where the broker keeps every message until all its groups acked it."""

    uri: str = ""
    durable: bool = True
    # Whether `stage_many` returns without waiting (never yields): the broker then stages
    # a read's messages in the connection's reader, which delivers them a turn of the
    # event loop sooner than a task of their own would; only the wait for `durable()`
    # gets a task. A store that waits to stage (MySQL's INSERT) keeps a task per read, so
    # the reader goes on reading meanwhile.
    stages_at_once: bool = False

    @abstractmethod
    async def start(self) -> None:
        """Open files or pools and recover state; raise StoreError if that is impossible."""

    @abstractmethod
    async def close(self) -> None:
        """Flush what was written and release every resource; idempotent."""

    @abstractmethod
    async def save(self, entity: MessageEntity) -> bool:
        """Store a new message durably; False if its id was already stored."""

    async def save_many(self, entities: Sequence[MessageEntity]) -> list[bool]:
        """Store several new messages at once; one answer per entity, as `save` gives it.

        Raises StoreError if any save failed (some may be stored: resending is safe, a
        stored id answers False). Stores share one write among them where they can; this
        default runs the saves concurrently, which a store that batches merges anyway; an
        id given twice is saved once, by its first entity, as saving one by one would.
        """
        first: dict[str, int] = {}
        for index, entity in enumerate(entities):
            first.setdefault(entity.message_id, index)
        saved = await _concurrently(self.save, [entities[index] for index in first.values()])
        answers = dict(zip(first, saved, strict=True))
        return [answers[e.message_id] and first[e.message_id] == i for i, e in enumerate(entities)]

    async def stage_many(self, entities: Sequence[MessageEntity]) -> Staged:
        """`save_many` in two steps: return once every message is in the store's state (a
        state call or a page sees it), with `durable()` to await what `save` promises.

        The broker delivers a message while the store syncs it and acks the producer only
        after `durable()`: a delivery never waits on an fsync, a store-ack still does. If
        `durable()` raises, the producer is told to resend (a delivered copy is then a
        duplicate, which at-least-once allows). Stores that cannot split the two (MySQL:
        a row is visible when committed) keep this default: the whole save, then nothing.
        """
        return Staged(await self.save_many(entities), _already_durable)

    @abstractmethod
    async def get(self, message_id: str) -> MessageEntity | None:
        """The message with its body and current state, dead or alive; None if gone."""

    @abstractmethod
    async def commit(self, message_id: str, due_at: float = 0.0) -> bool:
        """Make an uncommitted message deliverable from `due_at` (deliver_count reset to 0).

        `due_at` is the time a delayed message asked for (0: at once); the commit and the
        time are one durable change, so no crash can make it due early. True if the
        message exists and is now committed (also if it already was: then nothing changes).
        """

    @abstractmethod
    async def rollback(self, message_id: str) -> bool:
        """Delete an uncommitted message; False if unknown or already committed."""

    @abstractmethod
    async def update_delivery(
        self,
        message_id: str,
        succ_groups: Iterable[str],
        fail_groups: Iterable[str],
        deliver_count: int,
        next_deliver_at: float,
    ) -> bool:
        """Record a delivery round (or, for an uncommitted message, a tx check)."""

    async def update_delivery_many(self, updates: Sequence[DeliveryUpdate]) -> list[bool]:
        """`update_delivery` for each; one answer per update. Raises StoreError if any failed.

        The rounds that end together are recorded together: one at a time, a broker whose
        consumers outpace the recording (a group whose lane is full is owed every message)
        keeps the rounds, bodies and all, waiting their turn. Stores log them together
        where they can; this default runs them concurrently.
        """
        return await _concurrently(self._update_delivery_of, updates)

    async def _update_delivery_of(self, update: DeliveryUpdate) -> bool:
        return await self.update_delivery(
            update.message_id,
            update.succ_groups,
            update.fail_groups,
            update.deliver_count,
            update.next_deliver_at,
        )

    @abstractmethod
    async def finish(self, message_id: str) -> bool:
        """Every target group acked: forget the message and reclaim its space."""

    async def finish_many(self, message_ids: Sequence[str]) -> list[bool]:
        """`finish` for each id; one answer per id. Raises StoreError if any failed.

        Stores log them together where they can; this default runs them concurrently.
        """
        return await _concurrently(self.finish, message_ids)

    @abstractmethod
    async def dead_letter(self, message_id: str, reason: str) -> bool:
        """Move the message to the dead-letter queue; it is kept until redriven or purged."""

    async def dead_letter_many(self, letters: Sequence[DeadLetter]) -> list[bool]:
        """Dead-letter each message with its final deliver count and groups, and the time
        (as its next_deliver_at); whether each was found. Stores batch it (one fsync)."""
        found = []
        for letter in letters:
            await self.update_delivery(
                letter.message_id, letter.succ_groups, letter.fail_groups, letter.deliver_count, letter.at
            )
            found.append(await self.dead_letter(letter.message_id, letter.reason))
        return found

    @abstractmethod
    async def redrive(self, message_id: str) -> bool:
        """Bring a dead letter back: committed, deliver_count 0, due now, fail groups cleared."""

    @abstractmethod
    async def purge(self, message_id: str) -> bool:
        """Delete a dead letter for good; False if it is not in the dead-letter queue."""

    @abstractmethod
    async def cancel(self, message_id: str) -> bool:
        """Delete a scheduled message that was never delivered (see `stores.schedule.scheduled_at`).

        False if it is unknown, dead, was not scheduled, or a delivery round of it was
        recorded. The broker makes sure no round of it is in flight.
        """

    @abstractmethod
    async def next_due_at(self, now: float) -> float | None:
        """The earliest time after `now` a committed, live message may fall due, or None.

        Never later than the true time (it may be earlier): the broker sleeps until then,
        so a delayed message or a retry is delivered on time however idle the broker is.
        """

    @abstractmethod
    async def page_due(
        self,
        now: float,
        after: Cursor | None,
        limit: int,
        skip: Container[str] = frozenset(),
        parked: Collection[str] = frozenset(),
    ) -> Page:
        """Committed, live messages with next_deliver_at <= now, not of a `parked` topic.

        Ids in `skip` are passed over without their bodies being loaded: the broker passes
        the messages already on their way. A page may then hold fewer than `limit` items
        (the file and memory stores fill it from further ids, MySQL does not); the cursor
        still says whether more follow. `parked` topics are those nobody can be delivered
        to now (every group bound to them persistent and offline): the file and memory
        stores do not even walk their messages, so a parked backlog costs nothing;
        MySQL passes over their rows without loading bodies.
        """

    @abstractmethod
    async def page_uncommitted(self, older_than: float, after: Cursor | None, limit: int) -> Page:
        """Uncommitted, live messages stored at or before `older_than` (created_at)."""

    @abstractmethod
    async def page_dead(self, after: Cursor | None, limit: int) -> Page:
        """Dead letters, oldest id first."""

    @abstractmethod
    async def page_messages(
        self, after: Cursor | None, limit: int, *, topic: str = "", stage: Stage | None = None
    ) -> Page:
        """Every stored message (this broker's, for a shared store; dead letters of all) in id
        order, only of `topic` and `stage` when given: for browsing a running broker.

        The file and memory stores walk id-ordered sets per stage (committed ones per topic),
        so a page costs O(log n + page) unless a topic filter must pass over other topics'
        uncommitted or dead messages; MySQL walks the primary key.
        """

    @abstractmethod
    async def stats(self) -> StoreStats:
        """Current counts; cheap enough to call every second."""


async def _concurrently(call: Callable[[T], Awaitable[bool]], items: Sequence[T]) -> list[bool]:
    """`call` on every item at once; the answers in order, or the first StoreError."""
    answers: list[bool | StoreError] = [False] * len(items)

    async def one(index: int, item: T) -> None:
        try:
            answers[index] = await call(item)
        except StoreError as exc:
            answers[index] = exc

    async with trio.open_nursery() as nursery:
        for index, item in enumerate(items):
            nursery.start_soon(one, index, item)
    for answer in answers:
        if isinstance(answer, StoreError):
            raise answer
    return answers  # type: ignore[return-value]


class SharedStore(MessageStore):
    """A store several brokers share (MySQL): every row has an owning broker.

    A broker scans (`page_due`, `page_uncommitted`) only the rows it owns, so two
    brokers never deliver the same message; the rows of a broker that died are taken
    over with `adopt` by a live one (kiteq/server/adoption.py decides when).
    """

    @abstractmethod
    def own_as(self, broker: str) -> None:
        """Before `start`: the owner id this broker writes and scans (its registered address).

        An owner given explicitly in the store's URI wins; the id must stay the same
        across restarts so a restarted broker finds its own rows.
        """

    @property
    @abstractmethod
    def owner(self) -> str:
        """The owner id in force."""

    @abstractmethod
    async def owners(self) -> set[str]:
        """Every broker that owns at least one row, this one included."""

    @abstractmethod
    async def adopt(self, dead_broker: str) -> int:
        """Take over every row `dead_broker` owns; how many moved. Harmless to repeat."""
