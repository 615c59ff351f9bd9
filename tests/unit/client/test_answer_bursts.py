"""A client woken by many answers at once sends again before it has woken them all.

A raw broker on loopback answers a whole window of sends with one write. Were every
waiting sender woken at once, all of them would queue their next message before the
client's writer ran, and the broker would get the next window in one block while the
client idled: the two would take turns. `ANSWER_BURST` wakes them a burst at a time, so
the writer runs while the rest still wait.
"""

from __future__ import annotations

import trio

from kiteq.client.connection import ANSWER_BURST, ClientConnection, Credentials
from protocol import Cmd, pb
from protocol.framing import FrameDecoder, encode_frame
from tests.helpers import TaskSteps
from tests.wire import header

WINDOW = 100


def _message(index: int) -> pb.BytesMessage:
    return pb.BytesMessage(header=header("order-svc", message_id=f"{index:032x}"), body=b"x")


async def _broker(stream: trio.SocketStream) -> None:
    """Accept the ConnMeta, then answer the first WINDOW messages with one write; read the rest."""
    decoder = FrameDecoder(1 << 20)
    waiting: list[int] = []
    answered = False
    while data := await stream.receive_some(1 << 16):
        for frame in decoder.feed(data):
            if frame.cmd is Cmd.CONN_META:
                await stream.send_all(
                    encode_frame(frame.opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=True, feedback="ok"))
                )
            elif frame.cmd is Cmd.BYTES_MESSAGE and not answered:
                waiting.append(frame.opaque)
        if len(waiting) == WINDOW and not answered:
            answered = True
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
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    resumed: list[int] = []
    # How many of the woken senders had resumed each time the client's writer task ran.
    steps = TaskSteps("ClientConnection._write", observe=lambda: len(resumed))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, _broker, listeners)
        connection = ClientConnection(f"127.0.0.1:{port}", Credentials("order-svc", "secret"))
        await nursery.start(connection.run)
        all_resumed = trio.Event()

        async def sender(index: int) -> None:
            await connection.request(Cmd.BYTES_MESSAGE, _message(index), 5.0)
            resumed.append(index)
            connection.send(
                0, Cmd.TX_ACK, pb.TxACKPacket(header=_message(index).header, status=1, feedback="commit")
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
