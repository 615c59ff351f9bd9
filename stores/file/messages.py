"""The payload of a MESSAGE record: a whole MessageEntity, sans-IO.

Layout: a fixed head (`HEAD`), then the variable parts in this order: message id,
topic, message type, producer group, broker, dead reason (their lengths are in the
head), properties and groups (length-prefixed string lists), and the body, which
runs to the end. Recovery reads only the head and the strings the index needs
(`decode_head`), never the properties or the body.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

from protocol import Cmd
from stores.entity import MessageEntity
from stores.errors import StoreError
from stores.schedule import scheduled_at

HEAD = struct.Struct("<ddqqiiBBHHHHHHII")
_FLAGS_AT = struct.calcsize("<ddqqiiB")  # the flags byte's offset in a MESSAGE payload
_LEN = struct.Struct("<I")
_COUNT = struct.Struct("<H")
_U16_MAX = 0xFFFF
_STRING_FIELDS = ("message_id", "topic", "message_type", "producer_group", "broker", "dead_reason")
_I32 = (-(2**31), 2**31 - 1)

COMMIT = 1
FLY = 2
SNAPPY = 4
DEAD = 8
# Stored with a kiteq.deliverAt still ahead, and no delivery round recorded since (the index clears it).
SCHEDULED = 16

NO_GROUPS: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


class Head(NamedTuple):
    """What the index keeps of a stored message (see index.Entry)."""

    message_id: str
    topic: str
    created_at: float
    next_deliver_at: float
    deliver_count: int
    flags: int
    groups: tuple[tuple[str, ...], tuple[str, ...]]
    dead_reason: str


def check_i32(name: str, value: int) -> int:
    if not _I32[0] <= value <= _I32[1]:
        raise StoreError(f"{name}={value} is out of range: the file store keeps it as a 32-bit integer")
    return value


def pack_strings(values: Iterable[str]) -> bytes:
    """Each string as a u32 length and its UTF-8 bytes."""
    parts = []
    for value in values:
        raw = value.encode()
        parts.append(_LEN.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def unpack_strings(data: bytes | memoryview, start: int, end: int) -> list[str]:
    values = []
    pos = start
    while pos < end:
        (length,) = _LEN.unpack_from(data, pos)
        pos += 4
        values.append(bytes(data[pos : pos + length]).decode())
        pos += length
    if pos != end:
        raise ValueError("string list overruns its length")
    return values


def pack_groups(succ: tuple[str, ...], fail: tuple[str, ...]) -> bytes:
    """A (succ_groups, fail_groups) pair: the count of succ, then every name."""
    if not succ and not fail:
        return b""
    if len(succ) > _U16_MAX:
        raise StoreError(f"{len(succ)} succ groups; the file store keeps at most {_U16_MAX} per message")
    return _COUNT.pack(len(succ)) + pack_strings(succ + fail)


def unpack_groups(data: bytes | memoryview, start: int, end: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if start == end:
        return NO_GROUPS
    (n_succ,) = _COUNT.unpack_from(data, start)
    names = unpack_strings(data, start + 2, end)
    return tuple(names[:n_succ]), tuple(names[n_succ:])


def encode_message(entity: MessageEntity) -> bytes:
    """The MESSAGE payload of `entity`, its state fields included."""
    strings = (
        entity.message_id.encode(),
        entity.topic.encode(),
        entity.message_type.encode(),
        entity.producer_group.encode(),
        entity.broker.encode(),
        entity.dead_reason.encode(),
    )
    props = pack_strings(s for item in entity.properties.items() for s in item) if entity.properties else b""
    groups = pack_groups(tuple(entity.succ_groups), tuple(entity.fail_groups))
    flags = (
        (COMMIT if entity.commit else 0)
        | (FLY if entity.fly else 0)
        | (SNAPPY if entity.snappy else 0)
        | (DEAD if entity.dead else 0)
        | (SCHEDULED if scheduled_at(entity) is not None else 0)
    )
    a, b, c, d, e, f = strings
    try:
        head = HEAD.pack(
            entity.created_at,
            entity.next_deliver_at,
            entity.expired_time,
            entity.create_time,
            entity.deliver_limit,
            entity.deliver_count,
            entity.kind,
            flags,
            len(a),
            len(b),
            len(c),
            len(d),
            len(e),
            len(f),
            len(props),
            len(groups),
        )
    except struct.error as exc:
        sizes = ", ".join(
            f"{name} {len(raw)} bytes" for name, raw in zip(_STRING_FIELDS, strings, strict=True)
        )
        raise StoreError(
            f"message {entity.message_id[:64]!r} does not fit the file store ({exc}): integers must fit "
            f"their fields and strings {_U16_MAX} bytes ({sizes})"
        ) from exc
    return b"".join((head, a, b, c, d, e, f, props, groups, entity.body))


def flags_of(payload: bytes) -> int:
    """The flags of a MESSAGE payload (as `encode_message` wrote them)."""
    return payload[_FLAGS_AT]


def head_of(data: bytes, start: int) -> bytes:
    """The MESSAGE payload at `start` up to its body: what a segment summary keeps of it."""
    lengths: tuple[int, ...] = HEAD.unpack_from(data, start)[8:]
    return data[start : start + HEAD.size + sum(lengths)]


def decode_head(data: bytes, start: int) -> Head:
    """The index's view of a MESSAGE payload at `start` (recovery's hot path: no body, no properties)."""
    fields = HEAD.unpack_from(data, start)
    id_len, topic_len, type_len, group_len, broker_len, reason_len, props_len, groups_len = fields[8:]
    pos = start + HEAD.size
    message_id = data[pos : pos + id_len].decode()
    pos += id_len
    topic = data[pos : pos + topic_len].decode()
    pos += topic_len + type_len + group_len + broker_len
    reason = data[pos : pos + reason_len].decode() if reason_len else ""
    pos += reason_len + props_len
    groups = unpack_groups(data, pos, pos + groups_len) if groups_len else NO_GROUPS
    # HEAD's fields 0, 1, 5 and 7: created_at, next_deliver_at, deliver_count, flags.
    return Head(message_id, topic, fields[0], fields[1], fields[5], fields[7], groups, reason)


# Cmd(value) goes through Enum's machinery; a dict lookup does not (decoding is on the recover loop's hot path).
_KINDS = {kind.value: kind for kind in Cmd}


def decode_message(data: bytes, start: int, end: int) -> MessageEntity:
    """The whole entity of a MESSAGE payload in `data[start:end]`.

    Unrolled, with positional arguments: every message paged from disk passes here, and
    the generic form (a loop over the parts, keyword arguments) cost twice as much.
    """
    (
        created_at,
        next_at,
        expired_time,
        create_time,
        deliver_limit,
        count,
        kind,
        flags,
        id_len,
        topic_len,
        type_len,
        group_len,
        broker_len,
        reason_len,
        props_len,
        groups_len,
    ) = HEAD.unpack_from(data, start)
    topic_at = start + HEAD.size + id_len
    type_at = topic_at + topic_len
    group_at = type_at + type_len
    broker_at = group_at + group_len
    reason_at = broker_at + broker_len
    props_at = reason_at + reason_len
    groups_at = props_at + props_len
    body_at = groups_at + groups_len
    if body_at > end:
        raise ValueError("message fields overrun the record")
    message_kind = _KINDS.get(kind)
    if message_kind is None:
        raise ValueError(f"{kind} is not a message command")
    props = unpack_strings(data, props_at, groups_at) if props_len else ()
    succ, fail = unpack_groups(data, groups_at, body_at) if groups_len else NO_GROUPS
    return MessageEntity(
        data[start + HEAD.size : topic_at].decode(),
        data[topic_at:type_at].decode(),
        data[type_at:group_at].decode(),
        data[group_at:broker_at].decode(),
        data[body_at:end],
        message_kind,
        expired_time,
        deliver_limit,
        bool(flags & COMMIT),
        bool(flags & FLY),
        dict(zip(props[::2], props[1::2], strict=True)) if props else {},
        create_time,
        bool(flags & SNAPPY),
        created_at,
        count,
        next_at,
        succ,
        fail,
        bool(flags & DEAD),
        data[reason_at:props_at].decode() if reason_len else "",
        data[broker_at:reason_at].decode(),
    )
