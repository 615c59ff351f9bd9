"""Dead-letter operations: list with filters, redrive, purge. Used by the admin routes.

Redrive and purge change the store, so each is audited (`audit.redrive`, `audit.purge`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass

from kiteq.server.admin.audit import IN_PROCESS, Caller, audited
from kiteq.server.delivery.dispatcher import Dispatcher
from kiteq.server.events import Events
from protocol.logevents import LogEvent
from stores import MessageEntity, MessageStore

PAGE = 500


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Which dead letters an operation applies to; empty fields match everything."""

    message_id: str = ""
    topic: str = ""
    group: str = ""
    reason: str = ""

    def matches(self, entity: MessageEntity) -> bool:
        return (
            (not self.message_id or entity.message_id == self.message_id)
            and (not self.topic or entity.topic == self.topic)
            and (not self.group or self.group in entity.fail_groups or self.group == entity.producer_group)
            and (not self.reason or entity.dead_reason == self.reason)
        )


async def dead_letters(store: MessageStore, selection: DeadFilter) -> AsyncIterator[MessageEntity]:
    if selection.message_id:
        entity = await store.get(selection.message_id)
        if entity is not None and entity.dead and selection.matches(entity):
            yield entity
        return
    cursor = None
    while True:
        page = await store.page_dead(cursor, PAGE)
        for entity in page.items:
            if selection.matches(entity):
                yield entity
        if page.cursor is None:
            return
        cursor = page.cursor


def describe(entity: MessageEntity) -> dict[str, object]:
    return {
        "message_id": entity.message_id,
        "topic": entity.topic,
        "message_type": entity.message_type,
        "producer_group": entity.producer_group,
        "reason": entity.dead_reason,
        "deliver_count": entity.deliver_count,
        "dead_at": entity.next_deliver_at,  # dead_letter_many keeps the time there
        "succ_groups": list(entity.succ_groups),
        "fail_groups": list(entity.fail_groups),
        "created_at": entity.created_at,
        "committed": entity.commit,
    }


class DeadLetters:
    """The dead-letter operations of the admin routes: list, redrive, purge."""

    def __init__(self, store: MessageStore, dispatcher: Dispatcher, events: Events) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.events = events

    async def list(self, selection: DeadFilter, limit: int) -> list[dict[str, object]]:
        found = []
        async for entity in dead_letters(self.store, selection):
            found.append(describe(entity))
            if len(found) >= limit:
                break
        return found

    async def redrive(self, selection: DeadFilter, caller: Caller = IN_PROCESS) -> int:
        """Bring matching dead letters back and deliver them now; the number redriven."""
        with audited("redrive", caller, asdict(selection)) as tally:
            chosen = [entity.message_id async for entity in dead_letters(self.store, selection)]
            for message_id in chosen:
                if not await self.store.redrive(message_id):
                    continue
                entity = await self.store.get(message_id)
                if entity is None:
                    continue
                tally.messages += 1
                self.events.emit(LogEvent.REDRIVEN, entity)
                self.dispatcher.submit(entity)
        return tally.messages

    async def purge(self, selection: DeadFilter, caller: Caller = IN_PROCESS) -> int:
        """Delete matching dead letters for good; the number purged."""
        with audited("purge", caller, asdict(selection)) as tally:
            chosen = [entity.message_id async for entity in dead_letters(self.store, selection)]
            for message_id in chosen:
                tally.messages += await self.store.purge(message_id)
        return tally.messages
