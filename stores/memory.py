"""`memory://` — every message in a dict. Fast, and gone when the process exits.

For tests, demos and fly-style traffic where losing messages on restart is acceptable.
The broker logs a warning when it runs on this store.
"""

from __future__ import annotations

import copy
import heapq
from collections import Counter
from collections.abc import Callable, Container, Iterable, Sequence

from stores.base import Cursor, MessageStore, Page, StoreStats
from stores.entity import MessageEntity


class MemoryStore(MessageStore):
    durable = False

    def __init__(self, uri: str = "memory://") -> None:
        self.uri = uri
        self._messages: dict[str, MessageEntity] = {}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def save(self, entity: MessageEntity) -> bool:
        if entity.message_id in self._messages:
            return False
        self._messages[entity.message_id] = copy.copy(entity)
        return True

    async def save_many(self, entities: Sequence[MessageEntity]) -> list[bool]:
        return [await self.save(entity) for entity in entities]

    async def finish_many(self, message_ids: Sequence[str]) -> list[bool]:
        return [await self.finish(message_id) for message_id in message_ids]

    async def get(self, message_id: str) -> MessageEntity | None:
        entity = self._messages.get(message_id)
        return copy.copy(entity) if entity is not None else None

    async def commit(self, message_id: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None:
            return False
        if not entity.commit:
            entity.commit = True
            entity.deliver_count = 0
            entity.next_deliver_at = 0.0
        return True

    async def rollback(self, message_id: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None or entity.commit:
            return False
        del self._messages[message_id]
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
        entity.succ_groups = tuple(succ_groups)
        entity.fail_groups = tuple(fail_groups)
        entity.deliver_count = deliver_count
        entity.next_deliver_at = next_deliver_at
        return True

    async def finish(self, message_id: str) -> bool:
        return self._messages.pop(message_id, None) is not None

    async def dead_letter(self, message_id: str, reason: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None:
            return False
        entity.dead = True
        entity.dead_reason = reason
        return True

    async def redrive(self, message_id: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None or not entity.dead:
            return False
        entity.dead = False
        entity.dead_reason = ""
        entity.commit = True
        entity.deliver_count = 0
        entity.next_deliver_at = 0.0
        entity.fail_groups = ()
        return True

    async def purge(self, message_id: str) -> bool:
        entity = self._messages.get(message_id)
        if entity is None or not entity.dead:
            return False
        del self._messages[message_id]
        return True

    async def page_due(
        self, now: float, after: Cursor | None, limit: int, skip: Container[str] = frozenset()
    ) -> Page:
        return self._page(
            lambda e: e.commit and not e.dead and e.next_deliver_at <= now and e.message_id not in skip,
            after,
            limit,
        )

    async def page_uncommitted(self, older_than: float, after: Cursor | None, limit: int) -> Page:
        return self._page(lambda e: not e.commit and not e.dead and e.created_at <= older_than, after, limit)

    async def page_dead(self, after: Cursor | None, limit: int) -> Page:
        return self._page(lambda e: e.dead, after, limit)

    def _page(self, wanted: Callable[[MessageEntity], bool], after: Cursor | None, limit: int) -> Page:
        start = after or ""
        matches = (e for e in self._messages.values() if e.message_id > start and wanted(e))
        items = heapq.nsmallest(limit + 1, matches, key=lambda e: e.message_id)
        more = len(items) > limit
        items = [copy.copy(e) for e in items[:limit]]
        return Page(items, items[-1].message_id if more else None)

    async def stats(self) -> StoreStats:
        live = [e for e in self._messages.values() if not e.dead]
        dead = Counter(e.dead_reason for e in self._messages.values() if e.dead)
        return StoreStats(
            kind="memory",
            messages=len(live),
            uncommitted=sum(1 for e in live if not e.commit),
            dead=sum(dead.values()),
            dead_by_reason=dict(dead),
            backlog_by_topic=dict(Counter(e.topic for e in live if e.commit)),
        )
