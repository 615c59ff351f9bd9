"""A consumer that reads slowly, with a small receive buffer (as KiteQ's Go client sets
16 KiB), harms only itself: no duplicates while it is merely slow, its heartbeats are
answered, and another group and the producer are served all the while.

The slow consumer is a raw socket, reading a few KiB at a time, as a foreign client would.
"""

from __future__ import annotations

import socket
from pathlib import Path

import trio

from kiteq import Binding, Consumer, Message, Producer
from kiteq.server.delivery.rounds import DELIVER_COUNT_PROPERTY
from protocol import BODY_TYPES, Cmd, FrameDecoder, encode_frame, pb
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until

MESSAGES = 1500
READ_BYTES = 4096
READ_EVERY = 0.02  # ~200 KB/s: ~8 s for all of them, far past deliver_timeout
HEARTBEAT_EVERY = 0.25


class SlowConsumer:
    def __init__(self) -> None:
        self.deliveries: list[tuple[str, str]] = []  # (message id, deliver count)
        self.heartbeat_waits: list[float] = []
        self.sent_heartbeats: dict[int, float] = {}
        self._sending = trio.Lock()  # acks and heartbeats come from two tasks

    async def _send(self, stream: trio.SocketStream, data: bytes) -> None:
        async with self._sending:
            await stream.send_all(data)

    async def run(self, address: str, group: str) -> None:
        host, _, port = address.rpartition(":")
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        await sock.connect((host, int(port)))
        stream = trio.SocketStream(sock)
        await stream.send_all(encode_frame(1, Cmd.CONN_META, pb.ConnMeta(groupId=group, secretKey="")))
        decoder = FrameDecoder()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._heartbeats, stream)
            while len(self.deliveries) < MESSAGES:
                await trio.sleep(READ_EVERY)
                for frame in decoder.feed(await stream.receive_some(READ_BYTES)):
                    body = BODY_TYPES[frame.cmd]()
                    body.ParseFromString(frame.body)
                    if frame.cmd is Cmd.HEARTBEAT:
                        self.heartbeat_waits.append(
                            trio.current_time() - self.sent_heartbeats.pop(frame.opaque)
                        )
                    elif frame.cmd is Cmd.BYTES_MESSAGE:
                        count = {p.key: p.value for p in body.header.properties}[DELIVER_COUNT_PROPERTY]
                        self.deliveries.append((body.header.messageId, count))
                        ack = pb.DeliverAck(
                            messageId=body.header.messageId,
                            topic="t",
                            messageType="x",
                            groupId="p",
                            status=True,
                        )
                        await self._send(stream, encode_frame(frame.opaque, Cmd.DELIVER_ACK, ack))
            nursery.cancel_scope.cancel()
        await stream.aclose()

    async def _heartbeats(self, stream: trio.SocketStream) -> None:
        opaque = 1000
        while True:
            await trio.sleep(HEARTBEAT_EVERY)
            opaque += 1
            self.sent_heartbeats[opaque] = trio.current_time()
            await self._send(stream, encode_frame(opaque, Cmd.HEARTBEAT, pb.HeartBeat(version=opaque)))


async def test_a_slow_reader_gets_no_duplicates_and_its_heartbeats_answered(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    fast = RecordingListener()
    slow = SlowConsumer()
    async with running_broker(tmp_path) as broker:
        # A watermark this high puts every message in flight to the slow reader at once.
        await broker.registry.put_bindings("slow", "t", [Binding.direct("t", "x", watermark=MESSAGES)])
        async with (
            Consumer(registry, group="fast", bindings=[Binding.direct("t", "x")], listener=fast),
            Producer(registry, group="p", topics=["t"]) as producer,
            trio.open_nursery() as nursery,
        ):
            await wait_until(lambda: len(broker.router.bindings) == 2, what="both bindings")
            nursery.start_soon(slow.run, broker.address, "slow")
            await wait_until(lambda: "slow" in broker.groups.groups(), what="the slow consumer")
            results = await producer.send_many([Message("t", "x", b"x" * 1024) for _ in range(MESSAGES)])
            assert all(result.ok for result in results), "every send stored while the slow one lags"
            await wait_until(lambda: len(fast.acked) == MESSAGES, timeout=30, what="the fast group served")
            assert len(slow.deliveries) < MESSAGES, "the fast group did not wait for the slow one"
            await wait_until(
                lambda: len(slow.deliveries) >= MESSAGES, timeout=60, what="the slow one, slowly"
            )
    ids = [message_id for message_id, _ in slow.deliveries]
    assert len(set(ids)) == len(ids) == MESSAGES, "no duplicates while it was merely slow"
    assert {count for _, count in slow.deliveries} == {"1"}
    assert broker.events.total("timeout") == 0
    assert slow.heartbeat_waits and max(slow.heartbeat_waits) < 2.0, max(slow.heartbeat_waits, default=None)
