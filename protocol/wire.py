"""The bodies every message passes through, encoded and decoded without protobuf objects.

A BytesMessage or StringMessage is encoded by its producer and decoded by the broker and
again by its consumer; every one is answered with a MessageStoreAck and acked with a
DeliverAck. Building and reading protobuf's objects for them cost more than the rest of
what the clients do per message (docs/performance-history.md, "Messages and acks encoded
and decoded by hand"), so these are written and read by hand: the same bytes protobuf
writes, the same fields it reads.

Decoding reads these messages' fields by protobuf's rules, merges included: a scalar
given twice keeps its last value, properties add up, and a second header merges into the
first (the broker delivers a message as its producer's bytes followed by a partial
header, kiteq.server.delivery.rounds). Anything else (an unknown field, a wrong wire
type, a varint that runs off the end, a required field missing) is left to protobuf:
what it skips or refuses, and how it says so, stays protobuf's (`decode_message`,
`decode_ack`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

from protocol import kiteq_pb2 as pb
from protocol.commands import Cmd
from protocol.errors import ProtocolError
from protocol.framing import Frame, decode_body

# Wire types.
_VARINT: Final = 0
_LENGTH_DELIMITED: Final = 2

# Tags (field number << 3 | wire type) of length-delimited fields, as written.
_FIELD_1: Final = b"\x0a"
_FIELD_2: Final = b"\x12"
_FIELD_3: Final = b"\x1a"
_FIELD_4: Final = b"\x22"
_FIELD_6: Final = b"\x32"
_FIELD_9: Final = b"\x4a"
_ONE_BYTE: Final = [bytes([n]) for n in range(0x80)]

_UINT64: Final = 1 << 64
_INT64_LIMIT: Final = 1 << 63
_UINT32: Final = 1 << 32
_INT32_LIMIT: Final = 1 << 31

# A header's required fields (1-8) as bits of field numbers, for "every required one there".
_HEADER_REQUIRED: Final = 0b1_1111_1110
_STRING_MESSAGE: Final = Cmd.STRING_MESSAGE
_STORE_ACK: Final = Cmd.MESSAGE_STORE_ACK
ACK_CMDS: Final = frozenset({Cmd.MESSAGE_STORE_ACK, Cmd.DELIVER_ACK})


@dataclass(slots=True)
class WireMessage:
    """A BytesMessage or StringMessage as received: its header's fields and its body
    (bytes for a BytesMessage, str for a StringMessage)."""

    cmd: Cmd
    message_id: str
    topic: str
    message_type: str
    expired_time: int
    deliver_limit: int
    group: str
    commit: bool
    fly: bool
    properties: dict[str, str]
    create_time: int
    snappy: bool
    body: bytes | str

    # Written out: built for every message received (docs/design.md, "compiled modules").
    def __init__(
        self,
        cmd: Cmd,
        message_id: str,
        topic: str,
        message_type: str,
        expired_time: int,
        deliver_limit: int,
        group: str,
        commit: bool,
        fly: bool,
        properties: dict[str, str],
        create_time: int,
        snappy: bool,
        body: bytes | str,
    ) -> None:
        self.cmd = cmd
        self.message_id = message_id
        self.topic = topic
        self.message_type = message_type
        self.expired_time = expired_time
        self.deliver_limit = deliver_limit
        self.group = group
        self.commit = commit
        self.fly = fly
        self.properties = properties
        self.create_time = create_time
        self.snappy = snappy
        self.body = body


@dataclass(slots=True)
class WireAck:
    """What the readers of a MessageStoreAck or a DeliverAck use of it: stored or
    processed, and why not. The feedback is text: bytes that are not UTF-8 (a proto2
    string may hold any) are replaced, as a peer's free text is anywhere else."""

    status: bool
    feedback: str

    # Written out: built for every message answered (docs/design.md, "compiled modules").
    def __init__(self, status: bool, feedback: str) -> None:
        self.status = status
        self.feedback = feedback


# -- encoding ---------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    """A non-negative integer as protobuf encodes it."""
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string(tag: bytes, value: str) -> bytes:
    data = value.encode()
    return b"".join((tag, _varint(len(data)), data))


@functools.lru_cache(maxsize=1024)
def _property(key: str, value: str) -> bytes:
    """One `properties` entry of a header (the few that recur, as a deliver count, are cached)."""
    entry = b"".join((_string(_FIELD_1, key), _string(_FIELD_2, value)))
    return b"".join((_FIELD_9, _varint(len(entry)), entry))


@functools.lru_cache(maxsize=1024)
def _shared_header_fields(
    topic: str,
    message_type: str,
    expired_time: int,
    deliver_limit: int,
    group: str,
    commit: bool,
    fly: bool,
) -> bytes:
    """Header fields 2-8, which messages of one topic and group share (they precede the properties)."""
    header = pb.Header(
        topic=topic,
        messageType=message_type,
        expiredTime=expired_time,
        deliverLimit=deliver_limit,
        groupId=group,
        commit=commit,
        fly=fly,
    )
    return header.SerializePartialToString()


@functools.lru_cache(maxsize=1024)
def _header_tail(create_time: int, snappy: bool) -> bytes:
    """Header fields 10 and 11, which follow the properties."""
    return pb.Header(createTime=create_time, snappy=snappy).SerializePartialToString()


def encode_message(
    message_id: str,
    topic: str,
    message_type: str,
    expired_time: int,
    deliver_limit: int,
    group: str,
    commit: bool,
    fly: bool,
    properties: list[tuple[str, str]],
    create_time: int,
    snappy: bool,
    body: bytes,
) -> bytes:
    """A BytesMessage or StringMessage (a str body encoded as UTF-8 by the caller), every
    header field set: what protobuf serializes for it, byte for byte."""
    header = b"".join(
        (
            _string(_FIELD_1, message_id),
            _shared_header_fields(topic, message_type, expired_time, deliver_limit, group, commit, fly),
            b"".join([_property(key, value) for key, value in properties]),
            _header_tail(create_time, snappy),
        )
    )
    return b"".join((_FIELD_1, _varint(len(header)), header, _FIELD_2, _varint(len(body)), body))


def encode_store_ack(message_id: str, stored: bool, feedback: str) -> bytes:
    """A MessageStoreAck, as protobuf serializes it."""
    status = b"\x10\x01" if stored else b"\x10\x00"  # field 2, a varint
    return b"".join((_string(_FIELD_1, message_id), status, _string(_FIELD_3, feedback)))


def encode_deliver_ack(
    message_id: str, topic: str, message_type: str, group: str, ok: bool, feedback: str
) -> bytes:
    """A DeliverAck, as protobuf serializes it."""
    status = b"\x28\x01" if ok else b"\x28\x00"  # field 5, a varint
    return b"".join(
        (
            _string(_FIELD_1, message_id),
            _string(_FIELD_2, topic),
            _string(_FIELD_3, message_type),
            _string(_FIELD_4, group),
            status,
            _string(_FIELD_6, feedback),
        )
    )


# -- decoding ---------------------------------------------------------------------------


class _LeftToProtobuf(Exception):
    """Not a body these rules read: protobuf decodes this one."""


def decode_message(frame: Frame) -> WireMessage:
    """A BytesMessage or StringMessage frame's fields.

    Raises a recoverable ProtocolError, as `decode_body` does, when the body does not
    parse, lacks a required field, or holds a string that is not UTF-8 (protobuf hands
    such a proto2 string over as bytes; no topic or id can be made of them).
    """
    try:
        return _decode(frame.cmd, frame.body)
    except (_LeftToProtobuf, UnicodeDecodeError):
        pass  # (a string that is not UTF-8 may yet be replaced by a later value of its field)
    message = decode_body(frame)
    assert isinstance(message, pb.BytesMessage | pb.StringMessage)
    try:
        return from_header(frame.cmd, message.header, message.body)
    except NotUtf8:
        raise _not_utf8(frame) from None


def decode_ack(frame: Frame) -> WireAck:
    """A MessageStoreAck's or DeliverAck's status and feedback.

    Raises a recoverable ProtocolError, as `decode_body` does, when the body does not
    parse or lacks a required field.
    """
    try:
        return _decode_ack(frame.cmd is _STORE_ACK, frame.body)
    except _LeftToProtobuf:
        pass
    ack = decode_body(frame)
    assert isinstance(ack, pb.MessageStoreAck | pb.DeliverAck)
    feedback: Any = ack.feedback  # bytes when they are not UTF-8
    return WireAck(ack.status, feedback if isinstance(feedback, str) else _text(feedback))


def _decode_ack(store_ack: bool, data: bytes) -> WireAck:
    """Both acks: field 1 the message id, strings up to the status (a varint), the
    feedback (a string) last; every field required but a DeliverAck's feedback."""
    status_field, required = (2, 0b1110) if store_ack else (5, 0b11_1110)
    feedback_field = status_field + 1
    status, feedback, seen = True, "", 0
    position, end = 0, len(data)
    while position < end:
        tag, position = _varint_at(data, position, end)
        number, wire_type = tag >> 3, tag & 7
        if number == 0 or number > feedback_field:
            raise _LeftToProtobuf
        seen |= 1 << number
        if number == status_field:
            if wire_type != _VARINT:
                raise _LeftToProtobuf
            value, position = _varint_at(data, position, end)
            status = value != 0
        elif wire_type == _LENGTH_DELIMITED:
            start, position = _span_at(data, position, end)
            if number == feedback_field:
                feedback = _text(data[start:position])
        else:
            raise _LeftToProtobuf
    if seen & required != required:
        raise _LeftToProtobuf  # protobuf names what is missing
    return WireAck(status, feedback)


def _text(data: bytes) -> str:
    return data.decode(errors="replace")


def _decode(cmd: Cmd, data: bytes) -> WireMessage:
    message = WireMessage(cmd, "", "", "", 0, 0, "", False, False, {}, 0, False, b"")
    seen = 0
    body_start = body_end = -1
    position, end = 0, len(data)
    while position < end:
        tag, position = _varint_at(data, position, end)
        if tag == 0x0A:  # a header; a second one merges into the first
            start, position = _span_at(data, position, end)
            seen |= _merge_header(message, data, start, position)
        elif tag == 0x12:
            body_start, position = _span_at(data, position, end)
            body_end = position
        else:
            raise _LeftToProtobuf
    if body_start < 0 or seen & _HEADER_REQUIRED != _HEADER_REQUIRED:
        raise _LeftToProtobuf  # protobuf names what is missing
    raw_body = data[body_start:body_end]
    message.body = raw_body.decode() if cmd is _STRING_MESSAGE else raw_body
    return message


def _merge_header(message: WireMessage, data: bytes, position: int, end: int) -> int:
    """Read one header into `message` as protobuf merges it (a scalar's last value wins,
    properties add up); the field numbers seen, as bits."""
    seen = 0
    while position < end:
        tag, position = _varint_at(data, position, end)
        number, wire_type = tag >> 3, tag & 7
        if number > 11:
            raise _LeftToProtobuf
        seen |= 1 << number
        if wire_type == _LENGTH_DELIMITED:
            start, position = _span_at(data, position, end)
            if number == 1:
                message.message_id = data[start:position].decode()
            elif number == 2:
                message.topic = data[start:position].decode()
            elif number == 3:
                message.message_type = data[start:position].decode()
            elif number == 6:
                message.group = data[start:position].decode()
            elif number == 9:
                key, text = _entry(data, start, position)
                message.properties[key] = text
            else:
                raise _LeftToProtobuf
        elif wire_type == _VARINT:
            value, position = _varint_at(data, position, end)
            if number == 4:
                message.expired_time = _int64(value)
            elif number == 5:
                message.deliver_limit = _int32(value)
            elif number == 7:
                message.commit = value != 0
            elif number == 8:
                message.fly = value != 0
            elif number == 10:
                message.create_time = _int64(value)
            elif number == 11:
                message.snappy = value != 0
            else:
                raise _LeftToProtobuf
        else:
            raise _LeftToProtobuf
    return seen


def _entry(data: bytes, position: int, end: int) -> tuple[str, str]:
    """A properties entry's key and value (both required; a repeated one's last wins)."""
    key = value = ""
    seen = 0
    while position < end:
        tag, position = _varint_at(data, position, end)
        if tag == 0x0A:
            seen |= 1
            start, position = _span_at(data, position, end)
            key = data[start:position].decode()
        elif tag == 0x12:
            seen |= 2
            start, position = _span_at(data, position, end)
            value = data[start:position].decode()
        else:
            raise _LeftToProtobuf
    if seen != 3:
        raise _LeftToProtobuf
    return key, value


def _varint_at(data: bytes, position: int, end: int) -> tuple[int, int]:
    """The varint at `position` and the position after it."""
    if position < end:
        byte = data[position]
        if byte < 0x80:  # most are: tags, lengths under 128, small numbers
            return byte, position + 1
    result = shift = 0
    while position < end and shift < 70:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
    raise _LeftToProtobuf


def _span_at(data: bytes, position: int, end: int) -> tuple[int, int]:
    """The start and end of the length-delimited value whose length is at `position`."""
    length, start = _varint_at(data, position, end)
    stop = start + length
    if stop > end:
        raise _LeftToProtobuf
    return start, stop


def _int64(value: int) -> int:
    if value >= _UINT64:
        raise _LeftToProtobuf
    return value - _UINT64 if value >= _INT64_LIMIT else value


def _int32(value: int) -> int:
    """As protobuf reads an int32: the varint's low 32 bits, signed."""
    if value >= _UINT64:
        raise _LeftToProtobuf
    value &= _UINT32 - 1
    return value - _UINT32 if value >= _INT32_LIMIT else value


def from_header(cmd: Cmd, header: Any, body: bytes | str) -> WireMessage:
    """A message from a header protobuf decoded: a transaction check's, or a message these
    rules leave to protobuf. Raises NotUtf8 for a string protobuf handed over as bytes.

    `header` is a `pb.Header` typed Any: its strings may be bytes whatever its stub says,
    and compiled code would refuse them where they are read, before they are checked.
    """
    entries = [(entry.key, entry.value) for entry in header.properties]
    texts = [header.messageId, header.topic, header.messageType, header.groupId]
    texts += [text for entry in entries for text in entry]
    if cmd is _STRING_MESSAGE:
        texts.append(body)
    if any(not isinstance(text, str) for text in texts):
        raise NotUtf8(cmd.name)
    return WireMessage(
        cmd,
        header.messageId,
        header.topic,
        header.messageType,
        header.expiredTime,
        header.deliverLimit,
        header.groupId,
        header.commit,
        header.fly,
        dict(entries),
        header.createTime,
        header.snappy,
        body,
    )


class NotUtf8(ValueError):
    """A string field of a message that is not UTF-8."""


def _not_utf8(frame: Frame) -> ProtocolError:
    return ProtocolError(
        f"{frame.cmd.name} body of {len(frame.body)} bytes holds a string that is not UTF-8",
        opaque=frame.opaque,
        recoverable=True,
    )


__all__ = [
    "NotUtf8",
    "WireMessage",
    "decode_message",
    "encode_deliver_ack",
    "encode_message",
    "encode_store_ack",
    "from_header",
]
