"""MessageEntity.copy: every field carried over, and nothing shared that its holder may change."""

from __future__ import annotations

import dataclasses

from protocol import Cmd
from stores.entity import MessageEntity

# No field at its default: a field that copy() forgot would come back as its default.
EVERY_FIELD_SET = MessageEntity(
    message_id="m" * 32,
    topic="trade",
    message_type="pay-succ",
    producer_group="order-svc",
    body=b"body",
    kind=Cmd.STRING_MESSAGE,
    expired_time=1_800_000_000,
    deliver_limit=7,
    commit=False,
    fly=True,
    properties={"k": "v"},
    create_time=1_700_000_000,
    snappy=True,
    created_at=12.5,
    deliver_count=3,
    next_deliver_at=99.5,
    succ_groups=("a",),
    fail_groups=("b",),
    dead=True,
    dead_reason="expired",
    broker="127.0.0.1:13800",
)


def test_every_field_is_set_away_from_its_default() -> None:
    defaults = MessageEntity("", "", "", "", b"")
    for field in dataclasses.fields(MessageEntity):
        name = field.name
        assert getattr(EVERY_FIELD_SET, name) != getattr(defaults, name), f"{name} is at its default"


def test_a_copy_has_every_field() -> None:
    copied = EVERY_FIELD_SET.copy()
    assert copied == EVERY_FIELD_SET and copied is not EVERY_FIELD_SET


def test_changing_a_copy_leaves_the_original_alone() -> None:
    original = EVERY_FIELD_SET.copy()
    copied = original.copy()
    copied.properties["added"] = "x"
    copied.deliver_count += 1
    copied.succ_groups += ("c",)
    assert original == EVERY_FIELD_SET
