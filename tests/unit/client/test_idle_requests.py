"""A client with one request at a time sends it from the requesting task: its writer task
is never woken (each wake is two turns of the event loop on a path that is all latency)."""

from __future__ import annotations

import trio

from kiteq.client.connection import ClientConnection, Credentials
from protocol import Cmd, pb
from protocol.framing import FrameDecoder, encode_frame
from tests.helpers import TaskSteps
from tests.wire import header


async def _broker(stream: trio.SocketStream) -> None:
    """Answer the ConnMeta and every message at once, one by one."""
    decoder = FrameDecoder(1 << 20)
    while data := await stream.receive_some(1 << 16):
        for frame in decoder.feed(data):
            if frame.cmd is Cmd.CONN_META:
                answer = encode_frame(
                    frame.opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=True, feedback="ok")
                )
            else:
                answer = encode_frame(
                    frame.opaque,
                    Cmd.MESSAGE_STORE_ACK,
                    pb.MessageStoreAck(messageId="", status=True, feedback="ok"),
                )
            await stream.send_all(answer)


async def test_one_request_at_a_time_never_wakes_the_writer() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    steps = TaskSteps("ClientConnection._write")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, _broker, listeners)
        connection = ClientConnection(f"127.0.0.1:{port}", Credentials("order-svc", "secret"))
        await nursery.start(connection.run)
        trio.lowlevel.add_instrument(steps)
        try:
            for index in range(5):
                message = pb.BytesMessage(header=header("order-svc", message_id=f"{index:032x}"), body=b"x")
                answer = await connection.request(Cmd.BYTES_MESSAGE, message, 5.0)
                assert isinstance(answer, pb.MessageStoreAck) and answer.status
        finally:
            trio.lowlevel.remove_instrument(steps)
        nursery.cancel_scope.cancel()
    assert steps.steps == 0
