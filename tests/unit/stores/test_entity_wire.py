"""MessageEntity.wire_bytes: the bytes protobuf would serialize, built from cached pieces."""

from __future__ import annotations

import pytest

from protocol import BODY_TYPES, Cmd
from stores.entity import MessageEntity

DELIVER_COUNT = (("kiteq.deliverCount", "3"),)

ENTITIES = {
    "bytes, defaults": MessageEntity("a" * 32, "trade", "pay-succ", "order-svc", b"body"),
    "string, properties": MessageEntity(
        "b" * 32,
        "trade",
        "pay-succ",
        "order-svc",
        "текст".encode(),
        kind=Cmd.STRING_MESSAGE,
        properties={"k": "v", "ключ": "значение", "empty": ""},
    ),
    "set flags and times": MessageEntity(
        "c" * 32,
        "t",
        "m",
        "g",
        b"x",
        expired_time=1_800_000_000,
        deliver_limit=7,
        commit=False,
        fly=True,
        create_time=1_700_000_000,
        snappy=True,
    ),
    "lengths past one varint byte": MessageEntity(
        "d" * 200, "topic" * 30, "type", "group", b"\x00" * 20_000, properties={"p" * 130: "v" * 300}
    ),
    "empty body and strings": MessageEntity("", "", "", "", b""),
}


@pytest.mark.parametrize("extra", [(), DELIVER_COUNT])
@pytest.mark.parametrize("name", list(ENTITIES))
def test_wire_bytes_are_what_protobuf_serializes(name: str, extra: tuple[tuple[str, str], ...]) -> None:
    entity = ENTITIES[name]
    wire = entity.to_wire()
    for key, value in extra:
        wire.header.properties.add(key=key, value=value)
    assert entity.wire_bytes(extra) == wire.SerializeToString()
    parsed = BODY_TYPES[entity.kind]()
    parsed.ParseFromString(entity.wire_bytes(extra))
    assert parsed == wire


def test_cached_pieces_follow_the_entity() -> None:
    """Two messages alike but for one shared field never share its cached bytes."""
    first = MessageEntity("e" * 32, "trade", "pay-succ", "order-svc", b"x", deliver_limit=5)
    second = MessageEntity("e" * 32, "trade", "pay-succ", "order-svc", b"x", deliver_limit=6)
    assert first.wire_bytes() != second.wire_bytes()
    parsed = BODY_TYPES[Cmd.BYTES_MESSAGE]()
    parsed.ParseFromString(second.wire_bytes())
    assert parsed.header.deliverLimit == 6
