"""What a correct producer does when a send fails: resend the same id until a broker stores it."""

from __future__ import annotations

import trio

from kiteq import Message, Producer, SendError


async def send_until_stored(producer: Producer, message: Message) -> int:
    """Resend `message` until it is stored (for up to 60 s); how many sends failed first.

    The first send runs without a deadline of its own: the benchmark sends every
    message through here, and a cancel scope per send shows in its profile.
    """
    try:
        await producer.send(message)
        return 0
    except SendError:
        failures = 1
    with trio.fail_after(60):
        while True:
            await trio.sleep(0.1)
            try:
                await producer.send(message)
                return failures
            except SendError:
                failures += 1
