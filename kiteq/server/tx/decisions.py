"""Applying a producer's commit or rollback, whichever way it arrives.

Decisions come from the producer after its local transaction, or as its answer to
a back-scan check. The store makes the race safe: commit only succeeds on a stored
message, rollback only on an uncommitted one, so of a commit and a rollback for the
same id exactly one wins, and delivery follows the winner.
"""

from __future__ import annotations

import structlog

from kiteq.server.delivery.dispatcher import Dispatcher
from kiteq.server.events import Events
from protocol import TxStatus
from stores import MessageStore

log = structlog.get_logger(__name__)


async def apply_decision(
    store: MessageStore, dispatcher: Dispatcher, events: Events, message_id: str, status: TxStatus
) -> bool:
    """Commit (and deliver) or roll back; False when the other decision had already won."""
    if status is TxStatus.COMMIT:
        entity = await store.get(message_id)
        was_committed = entity is not None and entity.commit
        if not await store.commit(message_id):
            log.warning(
                "tx.conflict",
                message_id=message_id,
                decision="commit",
                detail="message is unknown or was rolled back; commit ignored",
            )
            return False
        entity = await store.get(message_id)
        if entity is None:
            return True
        if not was_committed:
            events.emit("committed", entity, groups=dispatcher.target_groups(entity))
        dispatcher.submit(entity)
        return True
    if status is TxStatus.ROLLBACK:
        entity = await store.get(message_id)
        if await store.rollback(message_id):
            if entity is not None:
                events.emit("rolled_back", entity)
            return True
        if entity is not None and entity.commit:
            log.warning(
                "tx.conflict",
                message_id=message_id,
                decision="rollback",
                detail="message was already committed; rollback ignored",
            )
        return False
    return False
