"""A send made while earlier ones await their answers is written by the sender's task.

Requests in flight used to count as frames on their way, so a producer keeping a window
of sends (`Producer.pipeline`) sent each through the connection's writer task, a turn of
the event loop after it was made. Only requesters an answer woke and that have not run
yet still hold a send back for the writer (tests/unit/client/test_answer_bursts.py).
"""

from __future__ import annotations

import trio

from kiteq.client.connection import ClientConnection, Credentials
from protocol import Cmd, pb
from protocol.framing import FrameDecoder, encode_frame
from tests.wire import header

SENDS = 5


def _message(index: int) -> pb.BytesMessage:
    return pb.BytesMessage(header=header("order-svc", message_id=f"{index:032x}"), body=b"x")


async def _silent_broker(stream: trio.SocketStream, received: list[int], all_in: trio.Event) -> None:
    """Accept the ConnMeta, then record the opaques of the messages and never answer them."""
    decoder = FrameDecoder(1 << 20)
    while data := await stream.receive_some(1 << 16):
        for frame in decoder.feed(data):
            if frame.cmd is Cmd.CONN_META:
                await stream.send_all(
                    encode_frame(frame.opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=True, feedback="ok"))
                )
            elif frame.cmd is Cmd.BYTES_MESSAGE:
                received.append(frame.opaque)
                if len(received) == SENDS:
                    all_in.set()


async def test_each_send_of_a_window_reaches_the_socket_before_the_sender_yields() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    received: list[int] = []
    all_in = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            trio.serve_listeners, lambda stream: _silent_broker(stream, received, all_in), listeners
        )
        connection = ClientConnection(f"127.0.0.1:{port}", Credentials("order-svc", "secret"))
        await nursery.start(connection.run)
        framed = connection.framed
        assert framed is not None
        written = []
        for index in range(SENDS):
            before = framed.bytes_out
            connection.request_nowait(Cmd.BYTES_MESSAGE, _message(index), 5.0, lambda answer, timed_out: None)
            written.append(framed.bytes_out > before)
        assert connection.session.pending == SENDS
        assert written == [True] * SENDS, "each send went to the socket at once, none left for the writer"
        with trio.fail_after(5):
            await all_in.wait()
        nursery.cancel_scope.cancel()
    assert received == sorted(received), "in the order sent"
