"""A broker speaking raw KiteQ frames: the other end for tests of the project's client.

It accepts the client's ConnMeta and hands the test every other frame, so what such a
test checks is what the client puts on the wire and when, not what our broker does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import trio

from kiteq.client.connection import ClientConnection, Credentials
from protocol import Cmd, Frame, FrameDecoder, encode_frame, pb
from tests.wire import header

GROUP = "order-svc"


def numbered_message(index: int) -> pb.BytesMessage:
    """A message of GROUP whose id is `index` (32 hex digits)."""
    return pb.BytesMessage(header=header(GROUP, message_id=f"{index:032x}"), body=b"x")


async def frames_after_auth(stream: trio.SocketStream) -> AsyncIterator[Frame]:
    """Accept the client's ConnMeta, then yield every other frame it sends, until it hangs up."""
    decoder = FrameDecoder(1 << 20)
    while data := await stream.receive_some(1 << 16):
        for frame in decoder.feed(data):
            if frame.cmd is Cmd.CONN_META:
                await stream.send_all(
                    encode_frame(frame.opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=True, feedback="ok"))
                )
            else:
                yield frame


async def silent_broker(
    stream: trio.SocketStream, received: list[int], expected: int, all_in: trio.Event
) -> None:
    """Record the opaque of each message the client sends, answering none; set `all_in`
    once `expected` have come."""
    async for frame in frames_after_auth(stream):
        if frame.cmd is Cmd.BYTES_MESSAGE:
            received.append(frame.opaque)
            if len(received) == expected:
                all_in.set()


async def connected_client(
    nursery: trio.Nursery, broker: Callable[[trio.SocketStream], Awaitable[None]]
) -> ClientConnection:
    """A ClientConnection of GROUP, authenticated to `broker` on a loopback port (both in `nursery`)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    nursery.start_soon(trio.serve_listeners, broker, listeners)
    connection = ClientConnection(f"127.0.0.1:{port}", Credentials(GROUP, "secret"))
    await nursery.start(connection.run)
    return connection
