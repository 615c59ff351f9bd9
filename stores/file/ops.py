"""Payloads of the operation log's records (commit, rollback, delivery, finish, dead, redrive, purge,
cancel).

Every op names the message by id *and* by where its MESSAGE record is (segment,
offset): replay applies an op only to that very record, so an op never touches a
later message that reused the id after the first one was finished.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from stores.file.messages import NO_GROUPS, pack_groups, unpack_groups
from stores.file.records import RecordType

_BASE = struct.Struct("<IIH")
_DELIVERY = struct.Struct("<id")
_DUE_AT = struct.Struct("<d")  # a COMMIT's next_deliver_at: absent (0, due at once) in older logs


class Op(NamedTuple):
    rtype: RecordType
    message_id: str
    segment: int
    offset: int
    deliver_count: int = 0
    next_deliver_at: float = 0.0
    groups: tuple[tuple[str, ...], tuple[str, ...]] = NO_GROUPS
    reason: str = ""


def encode_op(op: Op, segment: int, offset: int) -> bytes:
    """The payload of `op` for the MESSAGE record at (segment, offset) (its record type is op.rtype).

    The location is passed apart: the store looks it up as it applies the op, and
    copying the op to fill it in showed per finished message.
    """
    raw_id = op.message_id.encode()
    base = _BASE.pack(segment, offset, len(raw_id)) + raw_id
    if op.rtype is RecordType.DELIVERY:
        return base + _DELIVERY.pack(op.deliver_count, op.next_deliver_at) + pack_groups(*op.groups)
    if op.rtype is RecordType.DEAD:
        return base + op.reason.encode()
    if op.rtype is RecordType.COMMIT and op.next_deliver_at:
        return base + _DUE_AT.pack(op.next_deliver_at)
    return base


def decode_op(rtype: int, data: bytes | memoryview, start: int, end: int) -> Op:
    segment, offset, id_len = _BASE.unpack_from(data, start)
    pos = start + _BASE.size
    message_id = bytes(data[pos : pos + id_len]).decode()
    pos += id_len
    kind = RecordType(rtype)
    if kind is RecordType.DELIVERY:
        count, next_at = _DELIVERY.unpack_from(data, pos)
        groups = unpack_groups(data, pos + _DELIVERY.size, end)
        return Op(kind, message_id, segment, offset, count, next_at, groups)
    if kind is RecordType.DEAD:
        return Op(kind, message_id, segment, offset, reason=bytes(data[pos:end]).decode())
    if kind is RecordType.COMMIT and end - pos >= _DUE_AT.size:
        return Op(kind, message_id, segment, offset, next_deliver_at=_DUE_AT.unpack_from(data, pos)[0])
    return Op(kind, message_id, segment, offset)
