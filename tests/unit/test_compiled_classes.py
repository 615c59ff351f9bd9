"""The classes built for every message are built by compiled code when their module is
compiled: a written-out `__init__`, not the interpreted one the dataclasses module (or
a NamedTuple) generates (docs/design.md, "compiled modules"). And the written-out
`__init__`s keep the generated ones' defaults, mutable ones fresh per instance."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from kiteq.client.message import Message
from kiteq.server.delivery.lanes import Delivery
from kiteq.server.delivery.rounds import Outcome, Round, Verdict
from protocol import Cmd
from protocol.framing import Frame
from protocol.session import Answered, MessageReceived, Request
from protocol.wire import WireAck, WireMessage
from stores.entity import MessageEntity

PER_MESSAGE = [
    MessageEntity,
    Round,
    Outcome,
    Delivery,
    Frame,
    MessageReceived,
    Answered,
    Request,
    Message,
    WireMessage,
    WireAck,
]


@pytest.mark.parametrize("cls", PER_MESSAGE, ids=lambda cls: cls.__name__)
def test_a_class_built_per_message_has_a_compiled_init(cls: type) -> None:
    source = sys.modules[cls.__module__].__file__ or ""
    if not source.endswith(".so"):
        pytest.skip(f"{cls.__module__} is interpreted in this install (KITEQ_PURE_PYTHON)")
    assert not isinstance(cls.__init__, types.FunctionType), (
        f"{cls.__name__}.__init__ is interpreted Python: write it out in the class"
    )


def _other(value: object) -> object:
    """A value of `value`'s type that differs from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, Cmd):
        return Cmd.STRING_MESSAGE if value is Cmd.BYTES_MESSAGE else Cmd.BYTES_MESSAGE
    others = {str: "other", int: 7, float: 7.5, bytes: b"other", dict: {"k": "v"}, tuple: ("g",)}
    return others[type(value)]


@pytest.mark.parametrize(
    "base",
    [MessageEntity("a", "t", "x", "g", b""), Message("t", "x", b"", ttl=1.0)],
    ids=lambda b: type(b).__name__,
)
def test_every_field_is_taken_by_name_and_set_on_its_own_attribute(base: object) -> None:
    # dataclasses.replace, and the code that builds them by keyword, pass fields by name.
    fields = [field.name for field in dataclasses.fields(base) if field.init]  # type: ignore[arg-type]
    values = {name: _other(getattr(base, name)) for name in fields}
    built = type(base)(**values)
    assert {name: getattr(built, name) for name in fields} == values


def test_defaults_are_the_fields_defaults_and_mutable_ones_are_fresh() -> None:
    first, second = MessageEntity("a", "t", "x", "g", b""), MessageEntity("b", "t", "x", "g", b"")
    assert first.properties == {} and first.properties is not second.properties
    defaults = {field.name: field.default for field in dataclasses.fields(MessageEntity)}
    for name, default in defaults.items():
        if default is not dataclasses.MISSING:
            assert getattr(first, name) == default, name
    one, two = Round.of(first, frozenset({"g"})), Round.of(second, frozenset({"g"}))
    one.offered("g")
    one.record("g", False, "timeout")
    assert two.pending == set() and two.failed == {} and two.succ == set()
    assert Outcome(Verdict.FINISH, (), (), 1).reason == ""
    sent, received = Message("t", "x", b""), Message("t", "x", b"")
    assert sent.message_id != received.message_id and sent.properties is not received.properties
    assert Message("t", "x", b"", message_id="given").message_id == "given"


def test_replace_and_equality_still_work() -> None:
    entity = MessageEntity("a", "t", "x", "g", b"body", properties={"k": "v"})
    changed = dataclasses.replace(entity, topic="other")
    assert changed.topic == "other" and changed.body == b"body" and changed.properties == {"k": "v"}
    assert entity == entity.copy() and entity != changed
    assert Frame(1, Cmd.BYTES_MESSAGE, b"x") == Frame(1, Cmd.BYTES_MESSAGE, b"x")
    assert Answered("request", "answer") != Answered("request", "other")
