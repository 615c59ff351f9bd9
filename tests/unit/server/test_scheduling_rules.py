"""Delayed messages: the rules of `kiteq.deliverAt` (validation, cancel, the /stats summary). Pure."""

from __future__ import annotations

import uuid

import pytest

from kiteq.server.cancel import refusal
from kiteq.server.stats import SCHEDULED_HOURS_SHOWN, scheduled_summary
from kiteq.server.validate import MAX_TTL_SECONDS, InvalidMessage, Limits, validate_message
from protocol.schedule import DELIVER_AT, BadDeliverAt, format_deliver_at, parse_deliver_at
from stores import MessageEntity

NOW = 1_800_000_000.0
HOUR = 3600


def entity(deliver_at: str | None = None, **fields: object) -> MessageEntity:
    e = MessageEntity(uuid.uuid4().hex, "trade", "pay-timeout", "order-svc", b"x", created_at=NOW)
    if deliver_at is not None:
        e.properties = {DELIVER_AT: deliver_at}
    for name, value in fields.items():
        setattr(e, name, value)
    return e


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1800000000000", NOW),
        ("1800000000001", NOW + 0.001),
        ("0", 0.0),
        ("9999999999999", 9_999_999_999.999),
    ],
)
def test_deliver_at_is_decimal_unix_milliseconds(text: str, seconds: float) -> None:
    assert parse_deliver_at(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "-1", "1.5e12", " 18", "\uff11\uff18", "18000000000000", "0x10", "soon"]
)
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(BadDeliverAt, match="milliseconds"):
        parse_deliver_at(text)


@pytest.mark.parametrize("at", [NOW, NOW + 0.0004, NOW + 1 / 3, NOW + 86_400.999])
def test_formatting_never_rounds_earlier(at: float) -> None:
    assert parse_deliver_at(format_deliver_at(at)) >= at
    assert parse_deliver_at(format_deliver_at(at)) - at < 0.001


@pytest.mark.parametrize(
    ("deliver_at", "expired_time", "max_delay", "refusal_text"),
    [
        ("later", -1, 3600.0, "milliseconds"),
        (format_deliver_at(NOW + 3601), -1, 3600.0, "beyond this broker's max_delay of 3600 s"),
        (format_deliver_at(NOW + 600), int(NOW + 300), 3600.0, "expiredTime is before"),
        (format_deliver_at(NOW + 60), -1, 0.0, "max_delay of 0 s"),
    ],
)
def test_validation_refuses_a_bad_schedule(
    deliver_at: str, expired_time: int, max_delay: float, refusal_text: str
) -> None:
    with pytest.raises(InvalidMessage, match=refusal_text):
        validate_message(entity(deliver_at, expired_time=expired_time), NOW, Limits(max_delay=max_delay))


def test_a_fly_message_cannot_wait() -> None:
    with pytest.raises(InvalidMessage, match="fly message is never stored"):
        validate_message(entity(format_deliver_at(NOW + 60), fly=True), NOW)
    validate_message(entity(format_deliver_at(NOW - 60), fly=True), NOW)  # due already: fine


@pytest.mark.parametrize(
    ("deliver_at", "expired_time", "expected_expiry"),
    [
        # The default lifetime (and its cap) counts from when the message is due.
        (NOW + 30 * 86_400, -1, int(NOW + 30 * 86_400) + MAX_TTL_SECONDS),
        (NOW + 30 * 86_400, int(NOW + 31 * 86_400), int(NOW + 31 * 86_400)),
        (NOW - 60, -1, int(NOW) + MAX_TTL_SECONDS),  # past: due now
        (NOW + 60, int(NOW + 60), int(NOW + 60)),  # expiring exactly when due is allowed
    ],
)
def test_a_delayed_message_lives_from_its_due_time(
    deliver_at: float, expired_time: int, expected_expiry: int
) -> None:
    message = entity(format_deliver_at(deliver_at), expired_time=expired_time)
    validate_message(message, NOW)
    assert message.expired_time == expected_expiry


@pytest.mark.parametrize(
    ("message", "group", "in_flight", "expected"),
    [
        (None, "order-svc", False, "no such message"),
        (entity(format_deliver_at(NOW + 60)), "other-svc", False, "only its producer group"),
        (entity(format_deliver_at(NOW + 60), dead=True), None, False, "purge it instead"),
        (entity(), "order-svc", False, "was not scheduled"),
        (entity(format_deliver_at(NOW - 1)), "order-svc", False, "was not scheduled"),
        (entity(format_deliver_at(NOW + 60)), "order-svc", True, "too late"),
        (entity(format_deliver_at(NOW + 60), deliver_count=1), "order-svc", False, "too late"),
        # Uncommitted: deliver_count counts tx checks, not deliveries.
        (entity(format_deliver_at(NOW + 60), commit=False, deliver_count=3), "order-svc", False, ""),
        (entity(format_deliver_at(NOW + 60)), "order-svc", False, ""),
        (entity(format_deliver_at(NOW + 60)), None, False, ""),  # an operator
    ],
)
def test_who_may_cancel_what(
    message: MessageEntity | None, group: str | None, in_flight: bool, expected: str
) -> None:
    found = refusal(message, group, in_flight)
    assert (expected in found) if expected else found == ""


def test_the_summary_lists_coming_hours_and_sums_the_rest() -> None:
    this_hour = int(NOW // HOUR) * HOUR
    by_hour = {
        this_hour - 2 * HOUR: 4,  # overdue: counted in the current hour
        this_hour: 1,
        this_hour + 5 * HOUR: 2,
        this_hour + SCHEDULED_HOURS_SHOWN * HOUR: 7,  # beyond the listed hours
    }
    summary = scheduled_summary({"trade": 10, "user": 4}, by_hour, NOW)
    assert summary["total"] == 14 and summary["later"] == 7
    assert [(row["start"], row["count"]) for row in summary["by_hour"]] == [
        (this_hour, 5),
        (this_hour + 5 * HOUR, 2),
    ]
    assert summary["by_hour"][0]["hour"].endswith(":00Z")
