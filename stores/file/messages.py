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
from typing import Any, NamedTuple

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


def decode_head(data: bytes, start: int) -> Head:
    """The index's view of a MESSAGE payload at `start` (recovery's hot path: no body, no properties)."""
    (
        created_at,
        next_at,
        _,
        _,
        _,
        count,
        _,
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
    pos = start + HEAD.size
    message_id = data[pos : pos + id_len].decode()
    pos += id_len
    topic = data[pos : pos + topic_len].decode()
    pos += topic_len + type_len + group_len + broker_len
    reason = data[pos : pos + reason_len].decode() if reason_len else ""
    pos += reason_len + props_len
    groups = unpack_groups(data, pos, pos + groups_len) if groups_len else NO_GROUPS
    return Head(message_id, topic, created_at, next_at, count, flags, groups, reason)


def _bounds(data: bytes | memoryview, start: int) -> tuple[tuple[Any, ...], list[int]]:
    """The head's fields and where each variable part starts (and the body)."""
    fields = HEAD.unpack_from(data, start)
    bounds = [start + HEAD.size]
    for length in fields[8:16]:
        bounds.append(bounds[-1] + length)
    return fields, bounds


def decode_message(data: bytes | memoryview, start: int, end: int) -> MessageEntity:
    """The whole entity of a MESSAGE payload in `data[start:end]`."""
    fields, b = _bounds(data, start)
    if b[8] > end:
        raise ValueError("message fields overrun the record")
    text = [bytes(data[b[i] : b[i + 1]]).decode() for i in range(6)]
    props = unpack_strings(data, b[6], b[7])
    succ, fail = unpack_groups(data, b[7], b[8])
    flags = fields[7]
    return MessageEntity(
        message_id=text[0],
        topic=text[1],
        message_type=text[2],
        producer_group=text[3],
        body=bytes(data[b[8] : end]),
        kind=Cmd(fields[6]),
        expired_time=fields[2],
        deliver_limit=fields[4],
        commit=bool(flags & COMMIT),
        fly=bool(flags & FLY),
        properties=dict(zip(props[::2], props[1::2], strict=True)),
        create_time=fields[3],
        snappy=bool(flags & SNAPPY),
        created_at=fields[0],
        deliver_count=fields[5],
        next_deliver_at=fields[1],
        succ_groups=succ,
        fail_groups=fail,
        dead=bool(flags & DEAD),
        dead_reason=text[5],
        broker=text[4],
    )
