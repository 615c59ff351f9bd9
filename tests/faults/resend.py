"""What a correct producer does when a send fails: resend the same id until a broker stores it."""

from __future__ import annotations

import trio

from kiteq import Message, Producer, SendError


async def send_until_stored(producer: Producer, message: Message) -> int:
    """Resend `message` until it is stored; how many sends failed first."""
    failures = 0
    with trio.fail_after(60):
        while True:
            try:
                await producer.send(message)
                return failures
            except SendError:
                failures += 1
                await trio.sleep(0.1)
