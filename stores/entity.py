"""The stored form of a message: its header, body and delivery state.

One dataclass serves every store. The header fields mirror KiteQ's `Header`
message; the state fields are the broker's bookkeeping, written only by the broker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol import Cmd, pb
from protocol.wire import WireMessage, encode_message

BYTES = Cmd.BYTES_MESSAGE
STRING = Cmd.STRING_MESSAGE


@dataclass(slots=True)
class MessageEntity:
    """A message as a store keeps it.

    `body` is always bytes: the UTF-8 encoding of a StringMessage body, so stores never
    care which kind they hold. `deliver_count` counts delivery rounds of a committed
    message; while the message is uncommitted it counts transaction checks instead
    (a message is never delivered and checked in the same stage).
    """

    message_id: str
    topic: str
    message_type: str
    producer_group: str
    body: bytes
    kind: Cmd = BYTES
    expired_time: int = -1
    deliver_limit: int = 100
    commit: bool = True
    fly: bool = False
    properties: dict[str, str] = field(default_factory=dict)
    create_time: int = 0
    snappy: bool = False
    created_at: float = 0.0
    deliver_count: int = 0
    next_deliver_at: float = 0.0
    succ_groups: tuple[str, ...] = ()
    fail_groups: tuple[str, ...] = ()
    dead: bool = False
    dead_reason: str = ""
    broker: str = ""

    # Written out: the generated one would stay interpreted (docs/design.md, "compiled
    # modules"); an entity is built for every message received and every one paged.
    def __init__(
        self,
        message_id: str,
        topic: str,
        message_type: str,
        producer_group: str,
        body: bytes,
        kind: Cmd = BYTES,
        expired_time: int = -1,
        deliver_limit: int = 100,
        commit: bool = True,
        fly: bool = False,
        properties: dict[str, str] | None = None,
        create_time: int = 0,
        snappy: bool = False,
        created_at: float = 0.0,
        deliver_count: int = 0,
        next_deliver_at: float = 0.0,
        succ_groups: tuple[str, ...] = (),
        fail_groups: tuple[str, ...] = (),
        dead: bool = False,
        dead_reason: str = "",
        broker: str = "",
    ) -> None:
        self.message_id = message_id
        self.topic = topic
        self.message_type = message_type
        self.producer_group = producer_group
        self.body = body
        self.kind = kind
        self.expired_time = expired_time
        self.deliver_limit = deliver_limit
        self.commit = commit
        self.fly = fly
        self.properties = {} if properties is None else properties
        self.create_time = create_time
        self.snappy = snappy
        self.created_at = created_at
        self.deliver_count = deliver_count
        self.next_deliver_at = next_deliver_at
        self.succ_groups = succ_groups
        self.fail_groups = fail_groups
        self.dead = dead
        self.dead_reason = dead_reason
        self.broker = broker

    def header(self) -> pb.Header:
        """The wire header, as the producer sent it (commit reflects the current state)."""
        header = pb.Header(
            messageId=self.message_id,
            topic=self.topic,
            messageType=self.message_type,
            expiredTime=self.expired_time,
            deliverLimit=self.deliver_limit,
            groupId=self.producer_group,
            commit=self.commit,
            fly=self.fly,
            createTime=self.create_time,
            snappy=self.snappy,
        )
        for key, value in self.properties.items():
            header.properties.add(key=key, value=value)
        return header

    def to_wire(self) -> pb.BytesMessage | pb.StringMessage:
        """The BytesMessage or StringMessage to deliver."""
        if self.kind is STRING:
            return pb.StringMessage(header=self.header(), body=self.body.decode("utf-8"))
        return pb.BytesMessage(header=self.header(), body=self.body)

    def wire_bytes(self, extra_properties: tuple[tuple[str, str], ...] = ()) -> bytes:
        """`to_wire()` serialized, with `extra_properties` after the message's own: the same bytes,
        built without protobuf objects (`protocol.wire`): every message paged from a store is
        serialized on its way out."""
        return encode_message(
            self.message_id,
            self.topic,
            self.message_type,
            self.expired_time,
            self.deliver_limit,
            self.producer_group,
            self.commit,
            self.fly,
            [*self.properties.items(), *extra_properties],
            self.create_time,
            self.snappy,
            self.body,
        )

    def is_expired(self, now: float) -> bool:
        return self.expired_time > 0 and now >= self.expired_time

    def copy(self) -> MessageEntity:
        """A copy its holder may change, properties included, without touching this one: what
        the memory store hands out, as the other stores hand out what they decode. (`copy.copy`
        of a compiled class goes through `__reduce_ex__`: 5 µs, a sixth of a drain's broker CPU.)"""
        return MessageEntity(
            message_id=self.message_id,
            topic=self.topic,
            message_type=self.message_type,
            producer_group=self.producer_group,
            body=self.body,
            kind=self.kind,
            expired_time=self.expired_time,
            deliver_limit=self.deliver_limit,
            commit=self.commit,
            fly=self.fly,
            properties=dict(self.properties),
            create_time=self.create_time,
            snappy=self.snappy,
            created_at=self.created_at,
            deliver_count=self.deliver_count,
            next_deliver_at=self.next_deliver_at,
            succ_groups=self.succ_groups,
            fail_groups=self.fail_groups,
            dead=self.dead,
            dead_reason=self.dead_reason,
            broker=self.broker,
        )


def entity_from_wire(message: WireMessage) -> MessageEntity:
    """Build an entity from a received BytesMessage/StringMessage (state fields zeroed).

    Positional arguments, in field order: once per message received, and keyword
    matching of 13 arguments costs as much as reading the header.
    """
    body = message.body
    return MessageEntity(
        message.message_id,
        message.topic,
        message.message_type,
        message.group,
        body.encode() if isinstance(body, str) else body,
        message.cmd,
        message.expired_time,
        message.deliver_limit,
        message.commit,
        message.fly,
        message.properties,
        message.create_time,
        message.snappy,
    )
