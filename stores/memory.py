"""`memory://` — every message in a dict. Fast, and gone when the process exits.

For tests, demos and fly-style traffic where losing messages on restart is acceptable.
The broker logs a warning when it runs on this store.

Scans walk sorted sets of ids kept per state (committed and live per topic,
uncommitted, dead), as the file store's index does, so a page costs O(log n + page)
and a parked topic's backlog is not walked at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Sequence

import trio

from stores.base import Cursor, DeliveryUpdate, MessageStore, Page, Stage, StoreStats, stage_walk
from stores.entity import MessageEntity
from stores.schedule import PROMOTE_STEP, Schedule, ScheduledCounts, scheduled_at
from stores.sortedids import SortedIds
from stores.waiting import WaitingTracker, summarize


class MemoryStore(MessageStore):
    durable = False
    stages_at_once = True  # stage_many never yields

    def __init__(self, uri: str = "memory://") -> None:
        self.uri = uri
        self._messages: dict[str, MessageEntity] = {}
        self._live: dict[str, SortedIds] = {}  # topic -> committed, live ids
        self._uncommitted = SortedIds()
        self._dead = SortedIds()
        self._waiting: WaitingTracker[tuple[str, tuple[str, ...]]] = WaitingTracker()
        self._schedule: Schedule[str] = Schedule()  # committed, live ids by when they are due
        self._scheduled_ids: set[str] = set()  # saved with a deliverAt ahead, no round recorded since
        self._scheduled: ScheduledCounts[str] = ScheduledCounts()

    def _ids_of(self, entity: MessageEntity) -> SortedIds:
        """The set `entity` belongs in, by its state."""
        if entity.dead:
            return self._dead
        if not entity.commit:
            return self._uncommitted
        live = self._live.get(entity.topic)
        if live is None:
            live = self._live[entity.topic] = SortedIds()
        return live

    def _link(self, entity: MessageEntity) -> None:
        """Index `entity` by its current state (the inverse of `_unlink`)."""
        self._ids_of(entity).add(entity.message_id)
        if entity.commit and not entity.dead:
            self._waiting.add((entity.topic, entity.succ_groups), entity.created_at)
            self._schedule.add(entity.message_id, entity.topic, entity.next_deliver_at)
            if entity.message_id in self._scheduled_ids:
                self._scheduled.add(entity.topic, entity.next_deliver_at)
            self._schedule.tidy(len(self._messages), self._live_times)

    def _unlink(self, entity: MessageEntity) -> None:
        self._ids_of(entity).discard(entity.message_id)
        if entity.commit and not entity.dead:
            self._waiting.remove((entity.topic, entity.succ_groups), entity.created_at)
            self._schedule.discard(entity.message_id, entity.topic)
            if entity.message_id in self._scheduled_ids:
                self._scheduled.remove(entity.topic, entity.next_deliver_at)

    def _remove(self, entity: MessageEntity) -> None:
        self._unlink(entity)
        self._scheduled_ids.discard(entity.message_id)
        del self._messages[entity.message_id]

    def _live_times(self) -> Iterator[tuple[str, str, float]]:
        for message_id, entity in self._messages.items():
            if entity.commit and not entity.dead:
                yield message_id, entity.topic, entity.next_deliver_at

    def _due_at(self, message_id: str) -> float | None:
        entity = self._messages.get(message_id)
        if entity is None or not entity.commit or entity.dead:
            return None
        return entity.next_deliver_at

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def save(self, entity: MessageEntity) -> bool:
        if entity.message_id in self._messages:
            return False
        stored = self._messages[entity.message_id] = entity.copy()
        if scheduled_at(stored) is not None and not stored.dead:
            self._scheduled_ids.add(stored.message_id)
        self._link(stored)
        return True

    async def save_many(self, entities: Sequence[MessageEntity]) -> list[bool]:
        return [await self.save(entity) for entity in entities]

    async def finish_many(self, message_ids: Sequence[str]) -> list[bool]:
        return [await self.finish(message_id) for message_id in message_ids]

    async def update_delivery_many(self, updates: Sequence[DeliveryUpdate]) -> list[bool]:
        return [await self._update_delivery_of(update) for update in updates]

    async def get(self, message_id: str) -> MessageEntity | None:
        entity = self._messages.get(message_id)
        return entity.copy() if entity is not None else None

    async def commit(self, message_id: str, due_at: float = 0.0) -> bool:
        entity = self._messages.get(message_id)
        if entity is None:
            return False
        if not entity.commit:
            self._unlink(entity)
            entity.commit = True
            entity.deliver_count = 0
            entity.next_deliver_at = due_at
            self._link(entity)
        return True

    async def rollback(self, message_id: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None or entity.commit:
            return False
        self._remove(entity)
        return True

    async def update_delivery(
        self,
        message_id: str,
        succ_groups: Iterable[str],
        fail_groups: Iterable[str],
        deliver_count: int,
        next_deliver_at: float,
    ) -> bool:
        entity = self._messages.get(message_id)
        if entity is None:
            return False
        self._unlink(entity)
        entity.succ_groups = tuple(succ_groups)
        entity.fail_groups = tuple(fail_groups)
        entity.deliver_count = deliver_count
        entity.next_deliver_at = next_deliver_at
        if entity.commit:  # its first recorded round ends its being scheduled
            self._scheduled_ids.discard(message_id)
        self._link(entity)
        return True

    async def finish(self, message_id: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None:
            return False
        self._remove(entity)
        return True

    async def dead_letter(self, message_id: str, reason: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None:
            return False
        self._unlink(entity)
        entity.dead = True
        entity.dead_reason = reason
        self._link(entity)
        return True

    async def redrive(self, message_id: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None or not entity.dead:
            return False
        self._unlink(entity)
        entity.dead = False
        entity.dead_reason = ""
        entity.commit = True
        entity.deliver_count = 0
        entity.next_deliver_at = 0.0
        entity.fail_groups = ()
        self._link(entity)
        return True

    async def purge(self, message_id: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None or not entity.dead:
            return False
        self._remove(entity)
        return True

    async def cancel(self, message_id: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None or entity.dead or message_id not in self._scheduled_ids:
            return False
        self._remove(entity)
        return True

    async def next_due_at(self, now: float) -> float | None:
        return self._schedule.next_at()

    async def page_due(
        self,
        now: float,
        after: Cursor | None,
        limit: int,
        skip: Container[str] = frozenset(),
        parked: Collection[str] = frozenset(),
    ) -> Page:
        while not self._schedule.promote(now, self._due_at, parked, PROMOTE_STEP):
            await trio.lowlevel.checkpoint()
        ids = self._schedule.walk(after, parked)
        return self._page(ids, lambda e: e.next_deliver_at <= now and e.message_id not in skip, limit)

    async def page_uncommitted(self, older_than: float, after: Cursor | None, limit: int) -> Page:
        return self._page(self._uncommitted.after(after), lambda e: e.created_at <= older_than, limit)

    async def page_dead(self, after: Cursor | None, limit: int) -> Page:
        return self._page(self._dead.after(after), lambda e: True, limit)

    async def page_messages(
        self, after: Cursor | None, limit: int, *, topic: str = "", stage: Stage | None = None
    ) -> Page:
        ids = stage_walk(self._live, self._uncommitted, self._dead, after, stage, topic or None)
        return self._page(ids, lambda e: topic in ("", e.topic), limit)

    def _page(self, ids: Iterator[str], wanted: Callable[[MessageEntity], bool], limit: int) -> Page:
        items: list[MessageEntity] = []
        for message_id in ids:
            entity = self._messages[message_id]
            if wanted(entity):
                if len(items) == limit:
                    return Page(items, items[-1].message_id)
                items.append(entity.copy())
        return Page(items, None)

    async def stats(self) -> StoreStats:
        dead = Counter(self._messages[message_id].dead_reason for message_id in self._dead)
        return StoreStats(
            kind="memory",
            messages=len(self._messages) - len(self._dead),
            uncommitted=len(self._uncommitted),
            dead=len(self._dead),
            dead_by_reason=dict(dead),
            backlog_by_topic={topic: len(ids) for topic, ids in self._live.items() if len(ids)},
            scheduled_by_topic=dict(self._scheduled.by_topic),
            scheduled_by_hour=dict(self._scheduled.by_hour),
            waiting=summarize(
                (topic, acked, n, oldest) for (topic, acked), n, oldest in self._waiting.items()
            ),
        )
