"""The stored form of a message: its header, body and delivery state.

One dataclass serves every store. The header fields mirror KiteQ's `Header`
message; the state fields are the broker's bookkeeping, written only by the broker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol import Cmd, pb

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

    def is_expired(self, now: float) -> bool:
        return self.expired_time > 0 and now >= self.expired_time


def entity_from_wire(kind: Cmd, message: pb.BytesMessage | pb.StringMessage) -> MessageEntity:
    """Build an entity from a received BytesMessage/StringMessage (state fields zeroed).

    Positional arguments, in field order: once per message received, and keyword
    matching of 13 arguments costs as much as reading the header.
    """
    header = message.header
    body = message.body.encode("utf-8") if isinstance(message, pb.StringMessage) else message.body
    properties = header.properties
    return MessageEntity(
        header.messageId,
        header.topic,
        header.messageType,
        header.groupId,
        body,
        kind if type(kind) is Cmd else Cmd(kind),
        header.expiredTime,
        header.deliverLimit,
        header.commit,
        header.fly,
        {entry.key: entry.value for entry in properties} if properties else {},
        header.createTime,
        header.snappy,
    )
