"""A consumer that reads slowly through a small receive buffer, as KiteQ's Go client (16 KiB)
under load: raw frames on a raw socket, nothing of the project's client library."""

from __future__ import annotations

import socket

import trio

from kiteq.server.delivery.rounds import DELIVER_COUNT_PROPERTY
from protocol import Cmd, FrameDecoder, encode_frame, pb


class SlowReader:
    """A raw consumer with a 16 KiB receive buffer that reads `read_bytes` every `read_every`
    seconds, acks each delivery it reads, and heartbeats every `heartbeat_every` seconds,
    timing the replies. Reads until `count` deliveries arrived (or until cancelled)."""

    def __init__(
        self, count: int, read_bytes: int = 4096, read_every: float = 0.02, heartbeat_every: float = 0.25
    ) -> None:
        self.count = count
        self.read_bytes = read_bytes
        self.read_every = read_every
        self.heartbeat_every = heartbeat_every
        self.deliveries: list[tuple[str, str]] = []  # (message id, deliver count)
        self.heartbeat_waits: list[float] = []
        self.bytes_ahead_of_heartbeats: list[int] = []  # read between a heartbeat and its reply
        self.sent_heartbeats: dict[int, tuple[float, int]] = {}  # opaque: (time, bytes read by then)
        self.bytes_read = 0
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
            while len(self.deliveries) < self.count:
                await trio.sleep(self.read_every)
                data = await stream.receive_some(self.read_bytes)
                self.bytes_read += len(data)
                for frame in decoder.feed(data):
                    if frame.cmd is Cmd.HEARTBEAT:
                        sent_at, read_by_then = self.sent_heartbeats.pop(frame.opaque)
                        self.heartbeat_waits.append(trio.current_time() - sent_at)
                        self.bytes_ahead_of_heartbeats.append(self.bytes_read - read_by_then)
                    elif frame.cmd is Cmd.BYTES_MESSAGE:
                        header = pb.BytesMessage.FromString(frame.body).header
                        count = {p.key: p.value for p in header.properties}[DELIVER_COUNT_PROPERTY]
                        self.deliveries.append((header.messageId, count))
                        ack = pb.DeliverAck(
                            messageId=header.messageId,
                            topic=header.topic,
                            messageType=header.messageType,
                            groupId=header.groupId,
                            status=True,
                        )
                        await self._send(stream, encode_frame(frame.opaque, Cmd.DELIVER_ACK, ack))
            nursery.cancel_scope.cancel()
        await stream.aclose()

    async def _heartbeats(self, stream: trio.SocketStream) -> None:
        opaque = 1000
        while True:
            await trio.sleep(self.heartbeat_every)
            opaque += 1
            self.sent_heartbeats[opaque] = (trio.current_time(), self.bytes_read)
            await self._send(stream, encode_frame(opaque, Cmd.HEARTBEAT, pb.HeartBeat(version=opaque)))
