"""Checks a produced message before it is stored: pure, no I/O.

The rules follow KiteQ's check_message handler (32-hex ids, deliverLimit and
expiredTime normalised), plus explicit size limits on header fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from protocol.schedule import DELIVER_AT, BadDeliverAt, parse_deliver_at
from stores.entity import MessageEntity

MESSAGE_ID = re.compile(r"[0-9a-fA-F]{32}")
MAX_DELIVER_LIMIT = 100
MAX_TTL_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class Limits:
    max_name_length: int = 255
    max_properties: int = 64
    max_property_bytes: int = 8192
    max_delay: float = 2 * 365 * 24 * 3600.0  # [delivery] max_delay


class InvalidMessage(ValueError):
    """The message is refused; the text goes back to the producer as the ack's feedback."""


def validate_message(entity: MessageEntity, now: float, limits: Limits = Limits()) -> None:
    """Refuse a malformed message and normalise its limits in place (as KiteQ does)."""
    if not MESSAGE_ID.fullmatch(entity.message_id):
        raise InvalidMessage("Invalid MessageId For UUID! messageId must be 32 hex characters")
    longest = limits.max_name_length
    if not (
        0 < len(entity.topic) <= longest
        and 0 < len(entity.message_type) <= longest
        and 0 < len(entity.producer_group) <= longest
    ):  # checked at once first: this runs for every message
        _refuse_names(entity, longest)
    if entity.properties:
        if len(entity.properties) > limits.max_properties:
            raise InvalidMessage(f"more than {limits.max_properties} properties")
        if sum(len(k) + len(v) for k, v in entity.properties.items()) > limits.max_property_bytes:
            raise InvalidMessage(f"properties exceed {limits.max_property_bytes} bytes")
    if entity.fly and not entity.commit:
        raise InvalidMessage("FLY MUST BE COMMITTED ! a fly message cannot be transactional")
    if entity.deliver_limit <= 0 or entity.deliver_limit > MAX_DELIVER_LIMIT:
        entity.deliver_limit = MAX_DELIVER_LIMIT
    if 0 < entity.expired_time <= now:
        raise InvalidMessage("Expired Message! expiredTime is in the past")
    # A delayed message's lifetime starts when it is due, not when it is sent.
    due = max(now, _deliver_at(entity, now, limits.max_delay))
    if entity.expired_time <= 0 or entity.expired_time > due + MAX_TTL_SECONDS:
        entity.expired_time = int(due) + MAX_TTL_SECONDS
    if entity.create_time <= 0:
        entity.create_time = int(now)


def _deliver_at(entity: MessageEntity, now: float, max_delay: float) -> float:
    """The time the message asks to be delivered at (`now` when it asks for none)."""
    text = entity.properties.get(DELIVER_AT) if entity.properties else None
    if text is None:
        return now
    try:
        at = parse_deliver_at(text)
    except BadDeliverAt as exc:
        raise InvalidMessage(str(exc)) from None
    if at > now + max_delay:
        raise InvalidMessage(
            f"{DELIVER_AT} is {at - now:.0f} s ahead, beyond this broker's max_delay of {max_delay:.0f} s"
        )
    if entity.fly and at > now:
        raise InvalidMessage(f"a fly message is never stored, so it cannot wait for {DELIVER_AT}")
    if 0 < entity.expired_time < at:
        raise InvalidMessage(f"expiredTime is before {DELIVER_AT}: the message would expire before it is due")
    return at


def _refuse_names(entity: MessageEntity, longest: int) -> None:
    for name, value in (
        ("topic", entity.topic),
        ("messageType", entity.message_type),
        ("groupId", entity.producer_group),
    ):
        if not value:
            raise InvalidMessage(f"header.{name} must not be empty")
        if len(value) > longest:
            raise InvalidMessage(f"header.{name} is longer than {longest} characters")
