"""Payload codecs of MESSAGE and op records: what goes in comes out, and what cannot fit is refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import Cmd
from stores import MessageEntity, StoreError
from stores.file.messages import decode_head, decode_message, encode_message
from stores.file.ops import Op, decode_op, encode_op
from stores.file.records import RecordType

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
groups = st.lists(text, max_size=3).map(tuple)

entities = st.builds(
    MessageEntity,
    message_id=text,
    topic=text,
    message_type=text,
    producer_group=text,
    body=st.binary(max_size=2000),
    kind=st.sampled_from([Cmd.BYTES_MESSAGE, Cmd.STRING_MESSAGE]),
    expired_time=st.integers(-(2**63), 2**63 - 1),
    deliver_limit=st.integers(-(2**31), 2**31 - 1),
    commit=st.booleans(),
    fly=st.booleans(),
    properties=st.dictionaries(text, text, max_size=4),
    create_time=st.integers(-(2**63), 2**63 - 1),
    snappy=st.booleans(),
    created_at=st.floats(allow_nan=False),
    deliver_count=st.integers(0, 2**31 - 1),
    next_deliver_at=st.floats(allow_nan=False),
    succ_groups=groups,
    fail_groups=groups,
    dead=st.booleans(),
    dead_reason=text,
    broker=text,
)


def test_a_payload_that_does_not_decode_is_a_value_error() -> None:
    """What `kiteq-admin store verify` reports as unreadable: a bad kind, a length past the end."""
    payload = bytearray(encode_message(MessageEntity("id", "t", "m", "g", b"body")))
    bad_kind = bytearray(payload)
    bad_kind[struct.calcsize("<ddqqii")] = 0xFE  # the command byte
    with pytest.raises(ValueError, match="not a message command"):
        decode_message(bytes(bad_kind), 0, len(bad_kind))
    with pytest.raises(ValueError, match="overrun"):
        decode_message(bytes(payload), 0, struct.calcsize("<ddqqiiBBHHHHHHII") + 2)  # id, topic, ... need 5


@given(entities)
def test_message_round_trip(entity: MessageEntity) -> None:
    payload = b"prefix" + encode_message(entity)
    assert decode_message(payload, 6, len(payload)) == entity
    head = decode_head(payload, 6)
    assert (head.message_id, head.topic, head.dead_reason) == (
        entity.message_id,
        entity.topic,
        entity.dead_reason,
    )
    assert (head.created_at, head.next_deliver_at, head.deliver_count) == (
        entity.created_at,
        entity.next_deliver_at,
        entity.deliver_count,
    )
    assert head.groups == (entity.succ_groups, entity.fail_groups)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("topic", "t" * 70_000, "topic 70000 bytes"), ("deliver_count", 2**31, "integers must fit")],
)
def test_what_does_not_fit_is_a_store_error(field: str, value: object, says: str) -> None:
    entity = MessageEntity("id", "topic", "type", "group", b"")
    setattr(entity, field, value)
    with pytest.raises(StoreError, match=says):
        encode_message(entity)


@given(
    st.sampled_from(list(RecordType)[2:9]),
    text,
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.floats(allow_nan=False),
    st.tuples(groups, groups),
    text,
)
def test_op_round_trip(
    rtype: RecordType,
    message_id: str,
    segment: int,
    offset: int,
    count: int,
    at: float,
    pair: tuple[tuple[str, ...], tuple[str, ...]],
    reason: str,
) -> None:
    op = Op(rtype, message_id, segment, offset)
    if rtype is RecordType.DELIVERY:
        op = op._replace(deliver_count=count, next_deliver_at=at, groups=pair)
    if rtype is RecordType.DEAD:
        op = op._replace(reason=reason)
    payload = encode_op(op, op.segment, op.offset)
    assert decode_op(rtype, payload, 0, len(payload)) == op
