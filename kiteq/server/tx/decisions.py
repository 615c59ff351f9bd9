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
from protocol.logevents import LogEvent
from protocol.schedule import deliver_at_of
from stores import MessageStore
from stores.entity import MessageEntity

log = structlog.get_logger(__name__)


async def apply_decision(
    store: MessageStore, dispatcher: Dispatcher, events: Events, entity: MessageEntity, status: TxStatus
) -> bool:
    """Commit (and deliver) or roll back `entity` as stored; False when the other decision had already won.

    The caller has checked that the decision comes from the message's producer group.
    """
    message_id = entity.message_id
    if status is TxStatus.COMMIT:
        # kiteq.deliverAt is absolute: committed before it, the message waits for it; after, it goes now.
        asked = deliver_at_of(entity.properties) or 0.0
        due_at = asked if asked > dispatcher.clock() else 0.0
        if not await store.commit(message_id, due_at):
            log.warning(
                "tx.conflict",
                message_id=message_id,
                decision="commit",
                detail="message was rolled back; commit ignored",
            )
            return False
        committed = await store.get(message_id)
        if committed is None:
            return True
        if not entity.commit:
            events.emit(LogEvent.COMMITTED, committed, groups=dispatcher.target_groups(committed))
        if committed.next_deliver_at > dispatcher.clock():
            dispatcher.on_retry(committed.next_deliver_at)
        else:
            dispatcher.submit(committed)
        return True
    if status is TxStatus.ROLLBACK:
        if await store.rollback(message_id):
            events.emit(LogEvent.ROLLED_BACK, entity)
            return True
        if entity.commit:
            log.warning(
                "tx.conflict",
                message_id=message_id,
                decision="rollback",
                detail="message was already committed; rollback ignored",
            )
        return False
    return False


def decision_of(status: int) -> TxStatus:
    """A TxACKPacket's status as a decision; a number KiteQ does not define is UNKNOWN."""
    try:
        return TxStatus(status)
    except ValueError:
        return TxStatus.UNKNOWN
