"""A foreign client speaking raw KiteQ frames: nothing of the project's client library.

Tests that play a hostile tenant or KiteQ's own Go client use it, so what they check
is the broker's behaviour on the wire, not what our client happens to send.
"""

from __future__ import annotations

import uuid
from typing import Any

import trio

from protocol import BODY_TYPES, Cmd, Frame, FrameDecoder, encode_frame, pb


def header(
    group: str, *, topic: str = "t", message_type: str = "x", commit: bool = True, message_id: str = ""
) -> pb.Header:
    """A message header as KiteQ's Go client fills it (every required field set)."""
    return pb.Header(
        messageId=message_id or uuid.uuid4().hex,
        topic=topic,
        messageType=message_type,
        expiredTime=-1,
        deliverLimit=100,
        groupId=group,
        commit=commit,
        fly=False,
    )


class RawPeer:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self._frames: list[Frame] = []
        self._opaque = 100

    @classmethod
    async def connect(cls, address: str) -> RawPeer:
        host, _, port = address.rpartition(":")
        return cls(await trio.open_tcp_stream(host, int(port)))

    @classmethod
    async def login(cls, address: str, group: str, secret: str = "") -> RawPeer:
        """Connect and authenticate; fails the test if the broker refuses."""
        peer = await cls.connect(address)
        ack = await peer.authenticate(group, secret)
        assert ack.status, ack.feedback
        return peer

    async def authenticate(self, group: str, secret: str) -> pb.ConnAuthAck:
        await self.send(1, Cmd.CONN_META, pb.ConnMeta(groupId=group, secretKey=secret, warmingupSec=0))
        _, ack = await self.receive(Cmd.CONN_AUTH_ACK)
        return ack

    def next_opaque(self) -> int:
        self._opaque += 1
        return self._opaque

    async def send(self, opaque: int, cmd: Cmd, message: Any) -> None:
        await self.stream.send_all(encode_frame(opaque, cmd, message))

    async def produce(self, message_header: pb.Header, body: bytes = b"body") -> pb.MessageStoreAck:
        """Send a BytesMessage and wait for its store ack."""
        opaque = self.next_opaque()
        await self.send(opaque, Cmd.BYTES_MESSAGE, pb.BytesMessage(header=message_header, body=body))
        while True:
            frame, ack = await self.receive(Cmd.MESSAGE_STORE_ACK)
            if frame.opaque == opaque:
                return ack

    async def receive(self, cmd: Cmd | None = None, timeout: float = 5.0) -> tuple[Frame, Any]:
        """The next frame (of `cmd`, skipping others) and its decoded body; fails after `timeout`."""
        with trio.fail_after(timeout):
            while True:
                while self._frames:
                    frame = self._frames.pop(0)
                    if cmd is None or frame.cmd is cmd:
                        body = BODY_TYPES[frame.cmd]()
                        body.ParseFromString(frame.body)
                        return frame, body
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError("the broker closed the connection")
                self._frames += self.decoder.feed(data)

    async def closed_by_broker(self, timeout: float = 5.0) -> bool:
        """True once the broker closes the connection (frames before that are read and dropped)."""
        with trio.move_on_after(timeout):
            try:
                while await self.stream.receive_some(65536):
                    pass
            except trio.BrokenResourceError:
                pass
            return True
        return False

    async def aclose(self) -> None:
        await self.stream.aclose()
