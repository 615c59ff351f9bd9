"""What applications implement to receive messages and answer transaction checks."""

from __future__ import annotations

from abc import ABC, abstractmethod

from kiteq.client.message import Message
from protocol import TxStatus


class MessageListener(ABC):
    """Consumes delivered messages.

    Return True to ack. Returning False, raising, or exceeding the consumer's
    per-message timeout nacks: the broker delivers the message again later (with
    backoff), up to its deliver limit, then dead-letters it. Delivery is at least
    once: use `message.message_id` (and `deliver_count`) to make handling idempotent.
    """

    @abstractmethod
    async def on_message(self, message: Message) -> bool: ...


class CheckMessageListener(ABC):
    """Answers the broker's question about a transactional message left uncommitted.

    Look up your own record of the local transaction by `message.message_id` and
    return COMMIT, ROLLBACK, or UNKNOWN (asked again later). Raising counts as UNKNOWN.
    """

    @abstractmethod
    async def check(self, message: Message) -> TxStatus: ...
