"""The message view of `GET /messages…` (pure) and the bounded delivery-log reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiteq.server.admin.logtrace import trace
from kiteq.server.admin.messages import State, clamp, finished, group_rows, preview, state_of
from protocol import Cmd
from protocol.schedule import DELIVER_AT
from stores import MessageEntity

NOW = 1_000.0


def entity(**fields: object) -> MessageEntity:
    message = MessageEntity("a" * 32, "t", "x", "p", b"body", created_at=900.0)
    for name, value in fields.items():
        setattr(message, name, value)
    return message


LATER = {DELIVER_AT: "1500000"}


@pytest.mark.parametrize(
    ("fields", "state"),
    [
        ({}, State.COMMITTED),
        ({"commit": False}, State.UNCOMMITTED),
        ({"dead": True, "dead_reason": "expired"}, State.DEAD),
        ({"properties": LATER, "next_deliver_at": 1_500.0}, State.SCHEDULED),
        ({"properties": LATER, "next_deliver_at": NOW}, State.COMMITTED),  # due now
        ({"properties": LATER, "next_deliver_at": 1_500.0, "deliver_count": 1}, State.COMMITTED),  # a retry
        ({"next_deliver_at": 1_500.0}, State.COMMITTED),  # leased, not asked to wait
        ({"properties": LATER, "next_deliver_at": 1_500.0, "commit": False}, State.UNCOMMITTED),
        ({"properties": LATER, "next_deliver_at": 1_500.0, "dead": True}, State.DEAD),
    ],
)
def test_the_state_of_a_stored_message(fields: dict[str, object], state: State) -> None:
    assert state_of(entity(**fields), NOW) is state


@pytest.mark.parametrize(
    ("fields", "limit", "shown"),
    [
        (
            {"body": "héllo".encode()},
            100,
            {"encoding": "text", "text": "héllo", "truncated": False, "bytes": 6},
        ),
        ({"body": "héllo".encode()}, 2, {"encoding": "text", "text": "h", "truncated": True, "bytes": 6}),
        ({"body": b"\xff\x00"}, 100, {"encoding": "base64", "text": "/wA=", "truncated": False, "bytes": 2}),
        (
            {"body": b"text", "snappy": True},
            100,
            {"encoding": "base64", "text": "dGV4dA==", "truncated": False, "bytes": 4},
        ),
        (
            {"body": b"", "kind": Cmd.STRING_MESSAGE},
            10,
            {"encoding": "text", "text": "", "truncated": False, "bytes": 0},
        ),
    ],
)
def test_a_body_preview_is_text_when_utf8_else_base64_cut_at_the_limit(
    fields: dict[str, object], limit: int, shown: dict[str, object]
) -> None:
    assert preview(entity(**fields), limit) == shown


def test_groups_come_from_routing_the_store_and_the_log() -> None:
    message = entity(succ_groups=("a",), fail_groups=("b",))
    events = [{"event": "delivered", "group": "c"}]
    assert group_rows(message, {"a", "d"}, events) == {
        "a": {"routed": True, "delivered": True, "acked": True, "failed": False},
        "b": {"routed": False, "delivered": True, "acked": False, "failed": True},
        "c": {"routed": False, "delivered": True, "acked": False, "failed": False},
        "d": {"routed": True, "delivered": False, "acked": False, "failed": False},
    }


def test_a_finished_message_is_told_from_its_events() -> None:
    events = [
        {"event": "stored", "topic": "t", "message_type": "x", "producer_group": "p"},
        {"event": "delivered", "group": "g"},
        {"event": "timeout", "group": "g"},
        {"event": "delivered", "group": "g"},
        {"event": "acked", "group": "g"},
        {"event": "finished"},
    ]
    view = finished("a" * 32, events)
    assert view["state"] is State.FINISHED and view["header"]["topic"] == "t"
    assert view["groups"] == {"g": {"routed": True, "delivered": True, "acked": True, "failed": False}}


@pytest.mark.parametrize(("asked", "expected"), [(0, 10), (-5, 10), (3, 3), (500, 100)])
def test_sizes_asked_for_are_clamped(asked: int, expected: int) -> None:
    assert clamp(asked, 10, 100) == expected


def write_log(path: Path, ids: list[str]) -> None:
    path.write_text(
        "".join(json.dumps({"event": "acked", "message_id": i}, separators=(",", ":")) + "\n" for i in ids)
    )


def test_the_trace_reads_rotated_files_oldest_event_first(tmp_path: Path) -> None:
    log = tmp_path / "delivery.log"
    write_log(log.with_name("delivery.log.2"), ["m", "other"])
    write_log(log.with_name("delivery.log.1"), ["other", "m"])
    write_log(log, ["m", "m"])
    found = trace(log, "m")
    assert len(found.events) == 4 and found.complete and not found.truncated
    assert found.bytes_read == sum(p.stat().st_size for p in tmp_path.iterdir())


def test_the_trace_stops_at_its_byte_budget_and_event_limit(tmp_path: Path) -> None:
    log = tmp_path / "delivery.log"
    write_log(log.with_name("delivery.log.1"), ["m"] * 10)
    write_log(log, ["m"] * 5)
    line = log.stat().st_size // 5
    budget = trace(log, "m", max_bytes=7 * line + 3)
    assert len(budget.events) == 5 + 2 and not budget.complete, "two whole lines of .1; the cut one left out"
    limited = trace(log, "m", limit=3)
    assert len(limited.events) == 3 and limited.truncated and limited.complete
    assert trace(tmp_path / "absent.log", "m").events == []
