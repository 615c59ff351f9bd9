"""Listeners and waits shared by the admin tests: a group held busy, and a poison message."""

from __future__ import annotations

from collections import Counter

import trio

from kiteq import Message, MessageListener

# Long enough that a held delivery never times out during a test.
HOLD = {"deliver_timeout": 120.0, "retry_base": 0.05, "retry_max": 0.1, "recover_interval": 0.05}


class HeldListener(MessageListener):
    """Takes deliveries and answers none until `release()`: a steady in-flight count."""

    def __init__(self) -> None:
        self.released = trio.Event()
        self.received = 0

    async def on_message(self, message: Message) -> bool:
        self.received += 1
        await self.released.wait()
        return True

    def release(self) -> None:
        self.released.set()


class PoisonListener(MessageListener):
    """Nacks bodies of b"poison" until `healed`, acks everything else."""

    def __init__(self) -> None:
        self.healed = False
        self.acked: Counter[str] = Counter()

    async def on_message(self, message: Message) -> bool:
        if message.body == b"poison" and not self.healed:
            return False
        self.acked[message.message_id] += 1
        return True
