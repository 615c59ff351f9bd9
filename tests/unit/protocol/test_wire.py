"""The hand-written codec of messages and acks, against protobuf: the same bytes written, the
same fields read, the same bodies refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiteq.client.message import Message
from kiteq.server.delivery.rounds import Round
from protocol import Cmd, Frame, ProtocolError, decode_body, pb
from protocol.wire import (
    WireAck,
    WireMessage,
    _decode,
    _decode_ack,
    decode_ack,
    decode_message,
    encode_deliver_ack,
    encode_message,
    encode_store_ack,
)
from stores.entity import entity_from_wire
from tests import wire

KINDS = [Cmd.BYTES_MESSAGE, Cmd.STRING_MESSAGE]
FIELDS = (
    "message_id",
    "topic",
    "message_type",
    "expired_time",
    "deliver_limit",
    "group",
    "commit",
    "fly",
    "properties",
    "create_time",
    "snappy",
    "body",
)

texts = st.text(max_size=40)
int64s = st.integers(-(2**63), 2**63 - 1)
int32s = st.integers(-(2**31), 2**31 - 1)
headers = st.builds(
    pb.Header,
    messageId=texts,
    topic=texts,
    messageType=texts,
    expiredTime=int64s,
    deliverLimit=int32s,
    groupId=texts,
    commit=st.booleans(),
    fly=st.booleans(),
    properties=st.lists(st.builds(pb.Entry, key=texts, value=texts), max_size=4),
    createTime=int64s,
    snappy=st.booleans(),
)


def protobuf_message(kind: Cmd, header: pb.Header, body: bytes | str) -> Any:
    if kind is Cmd.STRING_MESSAGE:
        return pb.StringMessage(header=header, body=body if isinstance(body, str) else body.decode())
    return pb.BytesMessage(header=header, body=body.encode() if isinstance(body, str) else body)


def fields_of(message: Any) -> dict[str, object]:
    """What protobuf reads from a parsed BytesMessage or StringMessage, named as WireMessage names it."""
    h = message.header
    return {
        "message_id": h.messageId,
        "topic": h.topic,
        "message_type": h.messageType,
        "expired_time": h.expiredTime,
        "deliver_limit": h.deliverLimit,
        "group": h.groupId,
        "commit": h.commit,
        "fly": h.fly,
        "properties": {entry.key: entry.value for entry in h.properties},
        "create_time": h.createTime,
        "snappy": h.snappy,
        "body": message.body,
    }


def decoded(message: WireMessage) -> dict[str, object]:
    return {name: getattr(message, name) for name in FIELDS}


# -- writing ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(KINDS), header=headers, body=st.text(max_size=300))
def test_a_message_is_written_as_protobuf_writes_it(kind: Cmd, header: pb.Header, body: str) -> None:
    expected = protobuf_message(kind, header, body).SerializeToString()
    properties = [(entry.key, entry.value) for entry in header.properties]
    written = encode_message(
        header.messageId,
        header.topic,
        header.messageType,
        header.expiredTime,
        header.deliverLimit,
        header.groupId,
        header.commit,
        header.fly,
        properties,
        header.createTime,
        header.snappy,
        body.encode(),
    )
    assert written == expected


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("body", [b"bytes \x00\xff" * 50, "текст " * 50])
def test_a_producers_message_is_written_as_its_protobuf_header_says(
    body: bytes | str, compress: bool
) -> None:
    message = Message(
        "trade", "pay-succ", body, group="order-svc", properties={"k": "v"}, create_time=1_800_000_000
    )
    parsed = pb.StringMessage() if isinstance(body, str) else pb.BytesMessage()
    parsed.ParseFromString(message.encode(compress))
    header = message.header()
    header.snappy = compress
    assert parsed.header == header
    assert (parsed.body == body) is not compress


@pytest.mark.parametrize("stored", [True, False])
def test_a_store_ack_is_written_as_protobuf_writes_it(stored: bool) -> None:
    for feedback in ("", "ok", "é" * 200):
        expected = pb.MessageStoreAck(messageId="m" * 32, status=stored, feedback=feedback)
        assert encode_store_ack("m" * 32, stored, feedback) == expected.SerializeToString()


@pytest.mark.parametrize("ok", [True, False])
def test_a_deliver_ack_is_written_as_protobuf_writes_it(ok: bool) -> None:
    for feedback in ("", "ok", "listener raised ValueError: é" * 10):
        expected = pb.DeliverAck(
            messageId="m" * 32, topic="trade", messageType="pay", groupId="g", status=ok, feedback=feedback
        )
        assert encode_deliver_ack("m" * 32, "trade", "pay", "g", ok, feedback) == expected.SerializeToString()


# -- reading ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(KINDS), header=headers, body=st.text(max_size=300))
def test_a_message_is_read_as_protobuf_reads_it(kind: Cmd, header: pb.Header, body: str) -> None:
    message = protobuf_message(kind, header, body)
    frame = Frame(7, kind, message.SerializeToString())
    assert decoded(_decode(kind, frame.body)) == fields_of(message), "read without protobuf"
    assert decoded(decode_message(frame)) == fields_of(message)


@pytest.mark.parametrize("kind", KINDS)
def test_a_delivery_as_the_broker_sends_it_is_read_without_protobuf(kind: Cmd) -> None:
    """The producer's bytes followed by a partial header: protobuf merges the two, and so do
    these rules, without handing the body to protobuf."""
    body: bytes | str = "text" if kind is Cmd.STRING_MESSAGE else b"bytes"
    sent = Message("trade", "pay-succ", body, group="p", properties={"k": "v"}, deliver_limit=0).encode()
    entity = entity_from_wire(decode_message(Frame(1, kind, sent)))
    entity.deliver_limit, entity.expired_time = 3, 1_900_000_000
    delivery = Round.of(entity, frozenset({"c"}), sent).body
    reference = pb.StringMessage() if kind is Cmd.STRING_MESSAGE else pb.BytesMessage()
    reference.ParseFromString(delivery)
    assert decoded(_decode(kind, delivery)) == fields_of(reference)
    assert fields_of(reference)["properties"] == {"k": "v", "kiteq.deliverCount": "1"}
    assert (reference.header.deliverLimit, reference.header.expiredTime) == (3, 1_900_000_000)


def mutations(data: bytes) -> st.SearchStrategy[bytes]:
    """`data` cut, grown, repeated or with a byte changed: bodies near the valid ones."""
    n = len(data)
    return st.one_of(
        st.integers(0, n).map(lambda i: data[:i]),
        st.tuples(st.integers(0, n), st.binary(min_size=1, max_size=8)).map(
            lambda t: data[: t[0]] + t[1] + data[t[0] :]
        ),
        st.tuples(st.integers(0, max(0, n - 1)), st.integers(0, 255)).map(
            lambda t: data[: t[0]] + bytes([t[1]]) + data[t[0] + 1 :]
        ),
        st.integers(0, n).map(lambda i: data + data[i:]),
    )


def near(valid: bytes, random_size: int) -> st.SearchStrategy[bytes]:
    """Random bytes, or `valid` mutated once or twice."""
    return st.one_of(st.binary(max_size=random_size), mutations(valid), mutations(valid).flatmap(mutations))


def refused_alike(frame: Frame, refused: ProtocolError, decode: Callable[[Frame], object]) -> None:
    """`decode` refuses `frame` as protobuf did, and the connection may go on."""
    with pytest.raises(ProtocolError) as caught:
        decode(frame)
    assert str(caught.value) == str(refused) and caught.value.recoverable


@st.composite
def bodies(draw: st.DrawFn) -> tuple[Cmd, bytes]:
    kind = draw(st.sampled_from(KINDS))
    valid = protobuf_message(kind, draw(headers), draw(st.text(max_size=20))).SerializeToString()
    return kind, draw(near(valid, 120))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies())
def test_any_body_is_read_or_refused_as_protobuf_reads_or_refuses_it(body: tuple[Cmd, bytes]) -> None:
    kind, data = body
    frame = Frame(9, kind, data)
    try:
        parsed = decode_body(frame)
    except ProtocolError as refused:
        refused_alike(frame, refused, decode_message)
        return
    h = parsed.header  # type: ignore[attr-defined]
    strings = [h.messageId, h.topic, h.messageType, h.groupId]
    strings += [text for entry in h.properties for text in (entry.key, entry.value)]
    if kind is Cmd.STRING_MESSAGE:
        strings.append(parsed.body)  # type: ignore[attr-defined]
    if any(isinstance(text, bytes) for text in strings):
        with pytest.raises(ProtocolError, match="not UTF-8") as caught:
            decode_message(frame)
        assert caught.value.recoverable and caught.value.opaque == 9
    else:
        assert decoded(decode_message(frame)) == fields_of(parsed)


def trade_header() -> pb.Header:
    return wire.header("g", topic="trade", message_type="pay", message_id="m" * 32)


def with_bytes_replaced(message: Any, old: bytes, new: bytes) -> bytes:
    data = message.SerializeToString()
    assert data.count(old) == 1
    return data.replace(old, new)


@pytest.mark.parametrize(
    ("kind", "old", "new"),
    [
        (Cmd.BYTES_MESSAGE, b"trade", b"tr\xffde"),
        (Cmd.BYTES_MESSAGE, b"value", b"val\xc3\x28"),
        (Cmd.STRING_MESSAGE, b"the body", b"the b\xf0dy"),
    ],
)
def test_a_string_that_is_not_utf8_is_refused(kind: Cmd, old: bytes, new: bytes) -> None:
    header = trade_header()
    header.properties.add(key="key", value="value")
    frame = Frame(3, kind, with_bytes_replaced(protobuf_message(kind, header, "the body"), old, new))
    with pytest.raises(ProtocolError, match="not UTF-8") as caught:
        decode_message(frame)
    assert caught.value.recoverable and caught.value.opaque == 3


def test_a_string_that_is_not_utf8_but_replaced_by_a_later_value_is_read_as_protobuf_reads_it() -> None:
    first = with_bytes_replaced(pb.BytesMessage(header=trade_header(), body=b"b"), b"trade", b"tr\xffde")
    later = pb.BytesMessage(header=pb.Header(topic="fixed")).SerializePartialToString()
    assert decode_message(Frame(1, Cmd.BYTES_MESSAGE, first + later)).topic == "fixed"


# -- reading acks ------------------------------------------------------------------------

ACKS = [Cmd.MESSAGE_STORE_ACK, Cmd.DELIVER_ACK]


def protobuf_ack(kind: Cmd, status: bool, feedback: str, text: str = "m") -> Any:
    if kind is Cmd.MESSAGE_STORE_ACK:
        return pb.MessageStoreAck(messageId=text, status=status, feedback=feedback)
    return pb.DeliverAck(
        messageId=text, topic=text, messageType=text, groupId=text, status=status, feedback=feedback
    )


def read_by_protobuf(frame: Frame) -> tuple[bool, str]:
    """A parsed ack's status and feedback, the feedback's bytes replaced where they are
    not UTF-8 (protobuf hands them over as bytes)."""
    ack: Any = decode_body(frame)
    feedback = ack.feedback
    return ack.status, feedback if isinstance(feedback, str) else feedback.decode(errors="replace")


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(ACKS), status=st.booleans(), feedback=texts, text=texts)
def test_an_ack_is_read_as_protobuf_reads_it_without_protobuf(
    kind: Cmd, status: bool, feedback: str, text: str
) -> None:
    data = protobuf_ack(kind, status, feedback, text).SerializeToString()
    assert _decode_ack(kind is Cmd.MESSAGE_STORE_ACK, data) == WireAck(status, feedback)
    assert decode_ack(Frame(1, kind, data)) == WireAck(status, feedback)


def test_the_acks_written_by_hand_are_read_back() -> None:
    store_ack = encode_store_ack("m" * 32, False, "bad message: no topic")
    assert decode_ack(Frame(1, Cmd.MESSAGE_STORE_ACK, store_ack)) == WireAck(False, "bad message: no topic")
    deliver_ack = encode_deliver_ack("m" * 32, "trade", "pay", "g", True, "ok")
    assert decode_ack(Frame(1, Cmd.DELIVER_ACK, deliver_ack)) == WireAck(True, "ok")


@st.composite
def ack_bodies(draw: st.DrawFn) -> tuple[Cmd, bytes]:
    kind = draw(st.sampled_from(ACKS))
    valid = protobuf_ack(kind, draw(st.booleans()), draw(texts), draw(texts)).SerializeToString()
    return kind, draw(near(valid, 60))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=ack_bodies())
def test_any_ack_is_read_or_refused_as_protobuf_reads_or_refuses_it(body: tuple[Cmd, bytes]) -> None:
    kind, data = body
    frame = Frame(9, kind, data)
    try:
        expected = read_by_protobuf(frame)
    except ProtocolError as refused:
        refused_alike(frame, refused, decode_ack)
        return
    ack = decode_ack(frame)
    assert (ack.status, ack.feedback) == expected


@pytest.mark.parametrize("kind", ACKS)
def test_feedback_that_is_not_utf8_is_read_with_its_bad_bytes_replaced(kind: Cmd) -> None:
    data = with_bytes_replaced(protobuf_ack(kind, False, "refused"), b"refused", b"ref\xffsed")
    assert decode_ack(Frame(1, kind, data)) == WireAck(False, "ref\ufffdsed")
    assert _decode_ack(kind is Cmd.MESSAGE_STORE_ACK, data) == WireAck(False, "ref\ufffdsed")
