"""Delayed delivery on the wire: the `kiteq.deliverAt` property. Pure.

Header properties are free-form in KiteQ's wire format, so any KiteQ client can ask
for a delayed delivery by setting this one: the Unix time in milliseconds, as a decimal
string, before which the broker must not deliver the message. It lives in `protocol/`
because it is part of the format between producers, broker, stores and the delivery
log, as the rest of the wire is.
"""

from __future__ import annotations

from collections.abc import Mapping

DELIVER_AT = "kiteq.deliverAt"
# How a broker's answer to a cancel (Cmd.CANCEL) begins when it does not hold the message:
# a producer then asks the next broker.
UNKNOWN_MESSAGE = "no such message"
# Longer than any millisecond time until the year 2286 plus a sign: a longer text is refused
# before it is parsed.
_MAX_DIGITS = 13


class BadDeliverAt(ValueError):
    """The property is not a time in Unix milliseconds; the text says what is expected."""


def parse_deliver_at(text: str) -> float:
    """The time `text` names, in Unix seconds; BadDeliverAt unless it is decimal milliseconds."""
    if not (0 < len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit()):
        raise BadDeliverAt(
            f"property {DELIVER_AT} must be the Unix time in milliseconds as decimal digits "
            f"(at most {_MAX_DIGITS}), e.g. 1767225600000"
        )
    return int(text) / 1000


def deliver_at_of(properties: Mapping[str, str]) -> float | None:
    """The delivery time a message asks for (Unix seconds), None if it asks for none.

    A malformed value also reads as none: the broker refuses such a message before it is
    stored (`parse_deliver_at` says why), so only a received or hand-made one can hold it.
    """
    text = properties.get(DELIVER_AT) if properties else None
    if text is None:
        return None
    try:
        return parse_deliver_at(text)
    except BadDeliverAt:
        return None


def format_deliver_at(at: float) -> str:
    """The property's value for Unix time `at` (seconds), rounded up to the millisecond so a
    message is never delivered before the moment asked for."""
    millis = int(at * 1000)
    return str(millis if millis >= at * 1000 else millis + 1)
