"""An idle path costs a client no wake-ups: one request at a time is sent from the requesting
task, its writer task never woken (each wake is two turns of the event loop on a path that is
all latency); and with no request pending, the task that times requests out sleeps."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from kiteq.client.connection import EXPIRY_TICK, HEARTBEAT_INTERVAL, ClientConnection, Credentials
from protocol import Cmd, pb
from protocol.framing import FrameDecoder, encode_frame
from protocol.wire import WireAck
from tests.helpers import TaskSteps
from tests.wire import header


def _broker(answers_messages: bool) -> Callable[[trio.SocketStream], Awaitable[None]]:
    async def serve(stream: trio.SocketStream) -> None:
        """Answer the ConnMeta, and every message at once (`answers_messages`), one by one."""
        decoder = FrameDecoder(1 << 20)
        while data := await stream.receive_some(1 << 16):
            for frame in decoder.feed(data):
                if frame.cmd is Cmd.CONN_META:
                    ack = pb.ConnAuthAck(status=True, feedback="ok")
                    await stream.send_all(encode_frame(frame.opaque, Cmd.CONN_AUTH_ACK, ack))
                elif answers_messages:
                    stored = pb.MessageStoreAck(messageId="", status=True, feedback="ok")
                    await stream.send_all(encode_frame(frame.opaque, Cmd.MESSAGE_STORE_ACK, stored))

    return serve


@asynccontextmanager
async def _connected(answers_messages: bool) -> AsyncIterator[ClientConnection]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, _broker(answers_messages), listeners)
        connection = ClientConnection(f"127.0.0.1:{port}", Credentials("order-svc", "secret"))
        await nursery.start(connection.run)
        yield connection
        nursery.cancel_scope.cancel()


def _message(index: int) -> bytes:
    return pb.BytesMessage(
        header=header("order-svc", message_id=f"{index:032x}"), body=b"x"
    ).SerializeToString()


async def test_one_request_at_a_time_never_wakes_the_writer() -> None:
    steps = TaskSteps("ClientConnection._write")
    async with _connected(answers_messages=True) as connection:
        trio.lowlevel.add_instrument(steps)
        try:
            for index in range(5):
                answer = await connection.request(Cmd.BYTES_MESSAGE, _message(index), 5.0)
                assert isinstance(answer, WireAck) and answer.status
        finally:
            trio.lowlevel.remove_instrument(steps)
    assert steps.steps == 0


async def test_an_idle_connection_wakes_no_expiry_task(autojump_clock: trio.testing.MockClock) -> None:
    """Ticking with nothing pending, 2,000 connections held by one process kept its core busy."""
    steps = TaskSteps("ClientConnection._expire_requests")
    async with _connected(answers_messages=False) as connection:
        await trio.sleep(3 * EXPIRY_TICK)  # the ticks after the handshake's answer: two at most
        trio.lowlevel.add_instrument(steps)
        try:
            await trio.sleep(HEARTBEAT_INTERVAL / 2)  # no request at all meanwhile
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert steps.steps == 0, "it ticked with nothing pending"

        # A request still times out on time: the first one wakes the task.
        started = trio.current_time()
        with pytest.raises(trio.TooSlowError):
            await connection.request(Cmd.BYTES_MESSAGE, _message(0), 1.0)
        assert 1.0 <= trio.current_time() - started <= 1.0 + 2 * EXPIRY_TICK
