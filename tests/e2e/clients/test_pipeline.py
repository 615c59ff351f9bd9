"""`Producer.pipeline`: many sends in flight from one task, each outcome handed to a callback.

Against a real broker for what it stores and refuses; against a raw one on loopback for
the answers a broker may never give (`ClientConnection.request_nowait`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from kiteq import Message, Producer, SendError
from kiteq.client.connection import ClientConnection, Credentials
from protocol import Cmd, pb
from protocol.framing import FrameDecoder, encode_frame
from tests.helpers import registry_uri, running_broker
from tests.wire import header

WINDOW = 16


async def test_every_message_gets_one_result_and_no_more_than_the_window_are_in_flight(
    tmp_path: Path,
) -> None:
    results: dict[str, SendError | None] = {}
    most_in_flight = 0
    async with (
        running_broker(tmp_path, server={"topics": ["t"]}) as broker,
        Producer(registry_uri(tmp_path), group="p", topics=["t"]) as producer,
    ):

        def on_result(message: Message, error: SendError | None) -> None:
            assert message.message_id not in results, "a second result for one message"
            results[message.message_id] = error

        messages = [Message("t", "x", b"%d" % i) for i in range(300)]
        async with producer.pipeline(on_result, window=WINDOW) as pipeline:
            for message in messages:
                await pipeline.send(message)
                most_in_flight = max(most_in_flight, pipeline.in_flight)
                assert pipeline.in_flight <= WINDOW
        assert pipeline.in_flight == 0, "leaving the block waits for every result"
        assert results == {m.message_id: None for m in messages}
        stored = [await broker.store.get(m.message_id) for m in messages]
    assert all(
        entity is not None and entity.body == m.body for entity, m in zip(stored, messages, strict=True)
    )
    assert most_in_flight == WINDOW, "the window filled up: sends did not wait for each ack"


async def test_a_refused_message_goes_to_on_result_and_the_rest_are_stored(tmp_path: Path) -> None:
    results: dict[str, SendError | None] = {}
    refused = Message("t", "x", b"bad", fly=True, commit=False)  # a fly message must be committed
    fine = [Message("t", "x", b"fine") for _ in range(3)]
    async with (
        running_broker(tmp_path, server={"topics": ["t"]}),
        Producer(registry_uri(tmp_path), group="p", topics=["t"]) as producer,
        producer.pipeline(lambda m, e: results.__setitem__(m.message_id, e)) as pipeline,
    ):
        for message in [fine[0], refused, *fine[1:]]:
            await pipeline.send(message)
    error = results.pop(refused.message_id)
    assert isinstance(error, SendError) and "refused" in str(error) and "FLY MUST BE COMMITTED" in str(error)
    assert error.message_id == refused.message_id
    assert results == {m.message_id: None for m in fine}


async def test_an_on_result_that_raises_stops_the_sender_not_the_connection(tmp_path: Path) -> None:
    def on_result(message: Message, error: SendError | None) -> None:
        raise ValueError(f"bookkeeping failed for {message.message_id}")

    async with (
        running_broker(tmp_path, server={"topics": ["t"]}),
        Producer(registry_uri(tmp_path), group="p", topics=["t"]) as producer,
    ):
        with pytest.raises(ValueError, match="bookkeeping failed"):
            async with producer.pipeline(on_result, window=1) as pipeline:
                for _ in range(3):
                    await pipeline.send(Message("t", "x", b"m"))
        # Raised in the sending task: the connection's reader, which called it, lives on.
        assert await producer.send(Message("t", "x", b"after"))


def test_a_window_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="window must be at least 1"):
        Producer("file:///nowhere.json", group="p", topics=["t"]).pipeline(lambda m, e: None, window=0)


async def _silent_broker(stream: trio.SocketStream, hang_up: trio.Event) -> None:
    """Accept the ConnMeta, read messages without answering; hang up once `hang_up` is set."""
    decoder = FrameDecoder(1 << 20)

    async def read() -> None:
        while data := await stream.receive_some(1 << 16):
            for frame in decoder.feed(data):
                if frame.cmd is Cmd.CONN_META:
                    ack = pb.ConnAuthAck(status=True, feedback="ok")
                    await stream.send_all(encode_frame(frame.opaque, Cmd.CONN_AUTH_ACK, ack))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await hang_up.wait()
        nursery.cancel_scope.cancel()
    await stream.aclose()


@pytest.mark.parametrize("ending", ["timeout", "hang-up"])
async def test_a_request_never_answered_is_reported_once(ending: str) -> None:
    hang_up = trio.Event()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    answers: list[tuple[object | None, bool]] = []
    answered = trio.Event()

    def on_answer(answer: object | None, timed_out: bool) -> None:
        answers.append((answer, timed_out))
        answered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, lambda s: _silent_broker(s, hang_up), listeners)
        connection = ClientConnection(f"127.0.0.1:{port}", Credentials("order-svc", "secret"))
        with trio.fail_after(10):
            async with trio.open_nursery() as connection_tasks:  # left once the connection ended
                await connection_tasks.start(connection.run)
                message = pb.BytesMessage(header=header("order-svc"), body=b"x").SerializeToString()
                timeout = 0.2 if ending == "timeout" else 30.0
                connection.request_nowait(Cmd.BYTES_MESSAGE, message, timeout, on_answer)
                if ending == "hang-up":
                    hang_up.set()
                await answered.wait()
                hang_up.set()  # after a timeout too: closing must not report it again
        nursery.cancel_scope.cancel()
    assert answers == [(None, ending == "timeout")]
    assert connection.session.pending == 0


async def test_a_send_cancelled_before_it_left_is_not_counted_in_flight(tmp_path: Path) -> None:
    results: dict[str, SendError | None] = {}
    sent = Message("t", "x", b"fine")
    with trio.fail_after(10):  # counted in flight, it would hold the block's exit for ever
        async with (
            running_broker(tmp_path, server={"topics": ["t"]}),
            Producer(registry_uri(tmp_path), group="p", topics=["t"]) as producer,
            producer.pipeline(lambda m, e: results.__setitem__(m.message_id, e)) as pipeline,
        ):
            with trio.move_on_after(0.2) as waited:  # no broker serves "u": the send waits for one
                await pipeline.send(Message("u", "x", b"nowhere"))
            assert waited.cancelled_caught
            assert pipeline.in_flight == 0, "a send that never left is not waited for"
            await pipeline.send(sent)
    assert results == {sent.message_id: None}
