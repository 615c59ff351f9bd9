"""A client woken by many answers at once sends again before it has woken them all.

A raw broker on loopback answers a whole window of sends with one write. Were every
waiting sender woken at once, all of them would queue their next message before the
client's writer ran, and the broker would get the next window in one block while the
client idled: the two would take turns. `ANSWER_BURST` wakes them a burst at a time, so
the writer runs while the rest still wait.
"""

from __future__ import annotations

import trio

from kiteq.client.connection import ANSWER_BURST
from protocol import Cmd, encode_frame, pb
from tests.helpers import TaskSteps
from tests.raw_broker import connected_client, frames_after_auth, numbered_message

WINDOW = 100


async def _broker(stream: trio.SocketStream) -> None:
    """Answer the first WINDOW messages with one write; read the rest."""
    waiting: list[int] = []
    async for frame in frames_after_auth(stream):
        if frame.cmd is Cmd.BYTES_MESSAGE and len(waiting) < WINDOW:
            waiting.append(frame.opaque)
            if len(waiting) == WINDOW:
                acks = [
                    encode_frame(
                        opaque,
                        Cmd.MESSAGE_STORE_ACK,
                        pb.MessageStoreAck(messageId="", status=True, feedback="ok"),
                    )
                    for opaque in waiting
                ]
                await stream.send_all(b"".join(acks))


async def test_the_writer_runs_before_every_answered_sender_has_resumed() -> None:
    assert ANSWER_BURST < WINDOW
    resumed: list[int] = []
    # How many of the woken senders had resumed each time the client's writer task ran.
    steps = TaskSteps("ClientConnection._write", observe=lambda: len(resumed))
    async with trio.open_nursery() as nursery:
        connection = await connected_client(nursery, _broker)
        all_resumed = trio.Event()

        async def sender(index: int) -> None:
            await connection.request(Cmd.BYTES_MESSAGE, numbered_message(index).SerializeToString(), 5.0)
            resumed.append(index)
            connection.send(
                0,
                Cmd.TX_ACK,
                pb.TxACKPacket(
                    header=numbered_message(index).header, status=1, feedback="commit"
                ).SerializeToString(),
            )
            if len(resumed) == WINDOW:
                all_resumed.set()

        trio.lowlevel.add_instrument(steps)
        try:
            async with trio.open_nursery() as senders:
                for index in range(WINDOW):
                    senders.start_soon(sender, index)
            with trio.fail_after(5):
                await all_resumed.wait()
        finally:
            trio.lowlevel.remove_instrument(steps)
        nursery.cancel_scope.cancel()
    between = [count for count in steps.seen if 0 < count < WINDOW]
    assert between, f"the writer ran only before or after all {WINDOW} senders resumed: {steps.seen}"
    assert min(between) <= 2 * ANSWER_BURST, "the writer ran within the first two bursts"
