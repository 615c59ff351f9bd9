"""The message as applications see it, and its mapping to KiteQ's wire messages."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from kiteq.client.compression import compress as snappy_compress
from protocol import Cmd, pb
from protocol.schedule import DELIVER_AT, deliver_at_of, format_deliver_at

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

    def to_wire(self, compress: bool = False) -> pb.BytesMessage | pb.StringMessage:
        """The wire message; `compress` sends the body snappy-compressed and flagged, as KiteQ's Go client."""
        body = snappy_compress(self.body) if compress else self.body
        # The header is filled in place: building it apart and passing it in copies it.
        if isinstance(body, str):
            wire: pb.BytesMessage | pb.StringMessage = pb.StringMessage(body=body)
        else:
            wire = pb.BytesMessage(body=bytes(body))
        self._fill(wire.header)
        if compress:
            wire.header.snappy = True
        return wire

    @property
    def deliver_at(self) -> float | None:
        """When the message asked to be delivered (Unix seconds; property kiteq.deliverAt), if it did."""
        return deliver_at_of(self.properties)

    def schedule(self, at: float) -> None:
        """Ask for delivery no earlier than Unix time `at` (sets the kiteq.deliverAt property)."""
        self.properties[DELIVER_AT] = format_deliver_at(at)

    def _fill(self, header: pb.Header) -> None:
        header.messageId = self.message_id
        header.topic = self.topic
        header.messageType = self.message_type
        # A delayed message's ttl counts from when it is due.
        lives_from = self.deliver_at or time.time()
        header.expiredTime = self.expired_time if self.ttl is None else int(lives_from + self.ttl)
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
        # Positional arguments, in field order: once per delivery, and keyword matching
        # of 14 arguments costs as much as reading the header.
        properties = {entry.key: entry.value for entry in header.properties}
        deliver_count = int(properties.pop(DELIVER_COUNT_PROPERTY, "0") or 0)
        return cls(
            header.topic,
            header.messageType,
            body,
            header.messageId,
            properties,
            header.expiredTime,
            header.deliverLimit,
            header.fly,
            header.commit,
            header.groupId,
            header.createTime,
            header.snappy,
            None,  # ttl: a received message has its expiredTime
            deliver_count,
        )

    @classmethod
    def from_wire(cls, message: pb.BytesMessage | pb.StringMessage) -> Message:
        return cls.from_header(message.header, message.body)
