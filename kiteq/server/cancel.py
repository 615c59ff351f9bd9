"""Cancelling a scheduled message, asked by its producer group over the wire or by an operator.

A message that asked for a later delivery (`kiteq.deliverAt`) may be cancelled until its
first delivery round: the store deletes it, so it is never delivered. The dispatcher holds
its id while the store works, so the recover loop cannot start a round in between.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from kiteq.server.delivery.dispatcher import Dispatcher
from kiteq.server.events import Events
from protocol.logevents import LogEvent
from protocol.schedule import UNKNOWN_MESSAGE
from protocol.session import quote
from stores import MessageStore
from stores.entity import MessageEntity
from stores.schedule import scheduled_at

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What a cancel did: `done`, or `why` not (sent back as the answer's feedback)."""

    done: bool
    why: str = ""


def refusal(entity: MessageEntity | None, group: str | None, in_flight: bool) -> str:
    """Why `entity` may not be cancelled by `group` (None: an operator); "" if it may. Pure."""
    if entity is None:
        return (
            f"{UNKNOWN_MESSAGE}: never stored here, already delivered and acked by every group, or cancelled"
        )
    if group is not None and entity.producer_group != group:
        return (
            f"group {quote(group)} may not cancel a message of group {quote(entity.producer_group)}: "
            "only its producer group may"
        )
    if entity.dead:
        return "the message is dead-lettered: purge it instead"
    if scheduled_at(entity) is None:
        return "the message was not scheduled (no kiteq.deliverAt ahead of when it was stored)"
    if in_flight or (entity.commit and entity.deliver_count > 0):
        return "too late: the message is being or was already delivered"
    return ""


async def cancel_scheduled(
    store: MessageStore, dispatcher: Dispatcher, events: Events, message_id: str, group: str | None
) -> Cancelled:
    """Cancel `message_id` if `refusal` allows it; StoreError propagates."""
    if message_id in dispatcher.held:
        return Cancelled(False, "a cancel of this message is under way; ask again")
    dispatcher.held.add(message_id)
    try:
        entity = await store.get(message_id)
        why = refusal(entity, group, message_id in dispatcher.rounds)
        if why:
            return Cancelled(False, why)
        assert entity is not None
        if not await store.cancel(message_id):  # a round was recorded meanwhile
            return Cancelled(False, "too late: the message is being or was already delivered")
        dispatcher.withdrawn.add(message_id)  # a page read before the cancel may still hold it
    finally:
        dispatcher.held.discard(message_id)
    events.emit(LogEvent.CANCELLED, entity, by=group if group is not None else "operator")
    log.info("message.cancelled", message_id=message_id, topic=entity.topic, by=group or "operator")
    return Cancelled(True)
