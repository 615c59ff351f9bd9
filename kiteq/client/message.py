"""The message as applications see it, and its mapping to KiteQ's wire messages."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from kiteq.client.compression import compress as snappy_compress
from protocol import Cmd, pb
from protocol.schedule import DELIVER_AT, deliver_at_of, format_deliver_at
from protocol.wire import WireMessage, encode_message, from_header

# Set by the broker on every delivery (see kiteq.server.delivery.rounds).
DELIVER_COUNT_PROPERTY = "kiteq.deliverCount"


def new_message_id() -> str:
    """32 lowercase hex characters, the only id form KiteQ brokers accept: the time of
    creation in milliseconds (48 bits), then 80 random bits.

    Time first, as in UUIDv7: brokers walk due messages in id order, so a backlog of this
    client's messages is delivered about oldest first, and a page of them lies together
    in a file store's segments (read a run at a time, not a record at a time). From
    `random`, not `os.urandom`: ids must be unique, not secret, and a syscall per message
    shows in a producer's profile. `random` is seeded from the OS and reseeded in a forked
    child, so processes never share a sequence.
    """
    return f"{(int(time.time() * 1000) << 80) | random.getrandbits(80):032x}"


@dataclass
class Message:
    """A message to send, or one received.

    `body` is bytes (sent as BytesMessage) or str (StringMessage). `expired_time` is
    unix seconds (-1: the broker's maximum of 7 days); `ttl` is a convenience that
    sets it relative to the send time. `deliver_count` is filled in on receipt: 1 on
    the first delivery, more on redeliveries, so consumers can tell and dedupe.
    `snappy` says the body is snappy-compressed (`header.snappy`): a Consumer
    decompresses before its listener sees the message, so a received one has it set
    only when that failed and the body is as it came.
    """

    topic: str
    message_type: str
    body: bytes | str
    message_id: str = field(default_factory=new_message_id)
    properties: dict[str, str] = field(default_factory=dict)
    expired_time: int = -1
    deliver_limit: int = 100
    fly: bool = False
    commit: bool = True
    group: str = ""
    create_time: int = 0
    snappy: bool = False
    ttl: float | None = None
    deliver_count: int = 0

    # Written out: the generated one would stay interpreted (docs/design.md, "compiled
    # modules"), and a message is built for every one sent and received.
    def __init__(
        self,
        topic: str,
        message_type: str,
        body: bytes | str,
        message_id: str | None = None,
        properties: dict[str, str] | None = None,
        expired_time: int = -1,
        deliver_limit: int = 100,
        fly: bool = False,
        commit: bool = True,
        group: str = "",
        create_time: int = 0,
        snappy: bool = False,
        ttl: float | None = None,
        deliver_count: int = 0,
    ) -> None:
        self.topic = topic
        self.message_type = message_type
        self.body = body
        self.message_id = new_message_id() if message_id is None else message_id
        self.properties = {} if properties is None else properties
        self.expired_time = expired_time
        self.deliver_limit = deliver_limit
        self.fly = fly
        self.commit = commit
        self.group = group
        self.create_time = create_time
        self.snappy = snappy
        self.ttl = ttl
        self.deliver_count = deliver_count

    @property
    def cmd(self) -> Cmd:
        return Cmd.STRING_MESSAGE if isinstance(self.body, str) else Cmd.BYTES_MESSAGE

    def header(self) -> pb.Header:
        header = pb.Header()
        self._fill(header)
        return header

    def encode(self, compress: bool = False) -> bytes:
        """The serialized BytesMessage or StringMessage (`cmd` says which); `compress` sends the
        body snappy-compressed and flagged, as KiteQ's Go client. Built without protobuf's
        objects (`protocol.wire`): one per message sent."""
        body = snappy_compress(self.body) if compress else self.body
        return encode_message(
            self.message_id,
            self.topic,
            self.message_type,
            self._expired_time(),
            self.deliver_limit,
            self.group,
            self.commit,
            self.fly,
            list(self.properties.items()),
            self.create_time or int(time.time()),
            self.snappy or compress,
            body.encode() if isinstance(body, str) else bytes(body),
        )

    @property
    def deliver_at(self) -> float | None:
        """When the message asked to be delivered (Unix seconds; property kiteq.deliverAt), if it did."""
        return deliver_at_of(self.properties)

    def schedule(self, at: float) -> None:
        """Ask for delivery no earlier than Unix time `at` (sets the kiteq.deliverAt property)."""
        self.properties[DELIVER_AT] = format_deliver_at(at)

    def _expired_time(self) -> int:
        if self.ttl is None:
            return self.expired_time
        # A delayed message's ttl counts from when it is due.
        return int((self.deliver_at or time.time()) + self.ttl)

    def _fill(self, header: pb.Header) -> None:
        header.messageId = self.message_id
        header.topic = self.topic
        header.messageType = self.message_type
        header.expiredTime = self._expired_time()
        header.deliverLimit = self.deliver_limit
        header.groupId = self.group
        header.commit = self.commit
        header.fly = self.fly
        header.createTime = self.create_time or int(time.time())
        header.snappy = self.snappy
        for key, value in self.properties.items():
            header.properties.add(key=key, value=value)

    @classmethod
    def from_header(cls, header: pb.Header, body: bytes | str) -> Message:
        """A message of a protobuf header (a transaction check's)."""
        kind = Cmd.STRING_MESSAGE if isinstance(body, str) else Cmd.BYTES_MESSAGE
        return cls.from_wire(from_header(kind, header, body))

    @classmethod
    def from_wire(cls, message: WireMessage) -> Message:
        """A delivery as received. Positional arguments, in field order: once per delivery,
        and keyword matching of 14 arguments costs as much as reading the header."""
        properties = message.properties
        deliver_count = int(properties.pop(DELIVER_COUNT_PROPERTY, "0") or 0)
        return cls(
            message.topic,
            message.message_type,
            message.body,
            message.message_id,
            properties,
            message.expired_time,
            message.deliver_limit,
            message.fly,
            message.commit,
            message.group,
            message.create_time,
            message.snappy,
            None,  # ttl: a received message has its expiredTime
            deliver_count,
        )
