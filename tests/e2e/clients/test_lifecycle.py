"""The async clients' lifecycle and options: graceful stop, concurrency, timeouts, fly messages."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio

from kiteq import Binding, Consumer, Message, MessageListener, Producer
from kiteq.client.connection import ClientConnection, Credentials
from kiteq.errors import ConnectionClosed
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until

DELIVERY_FAST = {"recover_interval": 0.05, "retry_base": 0.1, "retry_jitter": "none"}


async def test_consumer_stopped_mid_stream_loses_nothing_and_acks_each_message_once(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    bindings = [Binding.direct("t", "x", watermark=20)]
    first, second = RecordingListener(delay=0.05), RecordingListener()
    count = 200
    async with (
        running_broker(tmp_path, delivery=DELIVERY_FAST, server={"topics": ["t"]}) as broker,
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        async with Consumer(registry, group="g", bindings=bindings, listener=first, max_concurrency=8):
            await wait_until(lambda: len(broker.router.bindings) == 1)
            ids = {
                r.message_id
                for r in await producer.send_many([Message("t", "x", b"m") for _ in range(count)])
            }
            # Listeners finish in bursts and the next ones start a moment later: wait for a
            # moment when some are running, so the stop below interrupts real work.
            await wait_until(
                lambda: len(first.acked) >= 30 and first.running > 0,
                what="the first consumer to get going, listeners running",
            )
        assert first.running == 0
        assert {m.message_id for m in first.deliveries} == first.acked_ids, "every started listener finished"
        acked_by_first = broker.events.total("acked")
        assert acked_by_first == len(first.acked), "each of their acks reached the broker before the close"
        async with Consumer(registry, group="g", bindings=bindings, listener=second):
            await wait_until(
                lambda: first.acked_ids | second.acked_ids == ids, timeout=20, what="the rest, by the second"
            )
        await wait_until(lambda: broker.events.total("finished") == count)
        assert broker.events.total("acked") == count
        assert (await broker.store.stats()).messages == 0
    assert not first.acked_ids & second.acked_ids, "no message was processed twice"
    assert max(first.acked.values()) == 1 and max(second.acked.values()) == 1


async def test_max_concurrency_bounds_running_listeners(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener(delay=0.05)
    async with (
        running_broker(tmp_path) as broker,
        Consumer(
            registry,
            group="g",
            bindings=[Binding.direct("t", "x", watermark=100)],
            listener=listener,
            max_concurrency=3,
        ) as consumer,
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 1)
        await producer.send_many([Message("t", "x", b"m") for _ in range(30)])
        await wait_until(lambda: len(listener.acked) == 30)
        await wait_until(lambda: len(consumer._idle_workers) == 3)  # its workers, parked: no more
    assert listener.max_running == 3
    assert consumer.acked == 30


class StuckOnce(MessageListener):
    """Hangs on the first delivery of each message, answers the redelivery at once."""

    def __init__(self) -> None:
        self.attempts: list[int] = []

    async def on_message(self, message: Message) -> bool:
        self.attempts.append(message.deliver_count)
        if message.deliver_count == 1:
            await trio.sleep_forever()
        return True


async def test_message_timeout_acks_false_then_the_redelivery_succeeds(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = StuckOnce()
    async with (
        running_broker(tmp_path, delivery=DELIVERY_FAST) as broker,
        Consumer(
            registry, group="g", bindings=[Binding.direct("t", "x")], listener=listener, message_timeout=0.2
        ) as consumer,
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 1)
        await producer.send_string("t", "x", "stuck once")
        await wait_until(lambda: consumer.acked == 1, what="the redelivery acked")
        assert consumer.nacked == 1
        assert broker.events.total("nacked") == 1, "an ack with status false, not a broker-side timeout"
        assert broker.events.total("timeout") == 0
    assert listener.attempts == [1, 2]


async def test_fly_message_is_delivered_without_being_stored(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path) as broker,
        Consumer(registry, group="g", bindings=[Binding.fanout("t")], listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 1)
        fly = await producer.send_bytes("t", "fly", b"fire and forget", fly=True)
        kept = await producer.send_string("t", "kept", "stored", properties={"a": "1"})
        await wait_until(lambda: listener.acked_ids == {fly, kept})
        assert broker.events.total("stored") == 1
        assert await broker.store.get(fly) is None
    by_id = {m.message_id: m for m in listener.deliveries}
    assert by_id[fly].fly and by_id[fly].body == b"fire and forget"
    assert by_id[kept].properties == {"a": "1"} and by_id[kept].body == "stored"


async def test_a_broker_hanging_up_during_the_handshake_is_a_connection_error(tmp_path: Path) -> None:
    async def hang_up(stream: trio.SocketStream) -> None:
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, hang_up, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        connection = ClientConnection(f"127.0.0.1:{port}", Credentials("g", ""))
        with pytest.raises(ConnectionClosed, match="hung up during the handshake"):
            await connection.run()
        nursery.cancel_scope.cancel()


async def test_leaving_the_producer_right_after_send_tx_still_delivers_the_decision(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path, tx={"tx_scan_interval": 60.0}) as broker,
        Consumer(registry, group="g", bindings=[Binding.direct("t", "x")], listener=listener),
    ):

        async def commit(message: Message) -> bool:
            return True

        async with Producer(registry, group="p", topics=["t"]) as producer:
            message = Message("t", "x", b"decided last")
            await producer.send_tx(message, commit)
            # No checkpoint between the decision being queued and the exit: only the
            # exit's flush can get it out (the back-scan runs once a minute here).
        await wait_until(lambda: listener.acked_ids == {message.message_id}, what="the committed message")
        assert broker.events.total("committed") == 1
