"""What `GET /messages/{id}` and `GET /messages` show of a message. Pure: `now` is given.

A message's state is one of `State`; `finished` is the only one a store cannot show (a
finished message is forgotten), so it is read from the delivery log's events. Per
group, `delivered`/`acked`/`failed` come from the message's groups and, when the log
is on, from its events; the groups listed are those it routes to now, plus any the
store recorded (a binding may have gone since).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from protocol.logevents import LogEvent
from protocol.schedule import DELIVER_AT
from stores import MessageEntity, Stage

PREVIEW_BYTES = 1024  # one message shown
LIST_PREVIEW_BYTES = 256  # per row of a list
MAX_PREVIEW_BYTES = 64 * 1024
LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000
FAILED_EVENTS = frozenset((LogEvent.NACKED, LogEvent.TIMEOUT))


class State(StrEnum):
    UNCOMMITTED = "uncommitted"
    SCHEDULED = "scheduled"
    COMMITTED = "committed"
    FINISHED = "finished"
    DEAD = "dead"

    @property
    def stage(self) -> Stage | None:
        """The store's stage holding messages of this state (None: no store holds them)."""
        return _STAGES.get(self)


_STAGES = {
    State.UNCOMMITTED: Stage.UNCOMMITTED,
    State.SCHEDULED: Stage.COMMITTED,
    State.COMMITTED: Stage.COMMITTED,
    State.DEAD: Stage.DEAD,
}


def state_of(entity: MessageEntity, now: float) -> State:
    """A stored message's state at `now`: scheduled while its `kiteq.deliverAt` is ahead and
    no round has been recorded (a redriven or retried message is plain committed)."""
    if entity.dead:
        return State.DEAD
    if not entity.commit:
        return State.UNCOMMITTED
    if entity.deliver_count == 0 and entity.next_deliver_at > now and DELIVER_AT in entity.properties:
        return State.SCHEDULED
    return State.COMMITTED


def preview(entity: MessageEntity, limit: int) -> dict[str, Any]:
    """The body's first `limit` bytes: as text when it is UTF-8 (and not snappy), else base64."""
    body = entity.body
    head = body[:limit]
    shown: dict[str, Any] = {"bytes": len(body), "truncated": len(body) > limit}
    if not entity.snappy and _is_utf8(body):
        # Cut at a character boundary: a partial last character is left out.
        shown.update(encoding="text", text=head.decode("utf-8", errors="ignore"))
    else:
        shown.update(encoding="base64", text=base64.b64encode(head).decode("ascii"))
    return shown


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def header(entity: MessageEntity) -> dict[str, Any]:
    return {
        "topic": entity.topic,
        "message_type": entity.message_type,
        "producer_group": entity.producer_group,
        "created_at": entity.created_at,
        "expired_time": entity.expired_time,
        "deliver_limit": entity.deliver_limit,
        "properties": dict(entity.properties),
        "snappy": entity.snappy,
        "kind": "string" if entity.kind.name.startswith("STRING") else "bytes",
    }


def group_rows(
    entity: MessageEntity, routed: Iterable[str], events: Sequence[Mapping[str, object]] = ()
) -> dict[str, dict[str, bool]]:
    """Per group: routed (bound now), delivered, acked, failed (its last answer was a failure)."""
    routed = set(routed)
    delivered = {str(e.get("group")) for e in events if e.get("event") == LogEvent.DELIVERED}
    failed_in_log = {str(e.get("group")) for e in events if e.get("event") in FAILED_EVENTS}
    acked, failed = set(entity.succ_groups), set(entity.fail_groups)
    names = sorted(routed | acked | failed | delivered)
    return {
        group: {
            "routed": group in routed,
            "delivered": group in delivered or group in acked or group in failed or group in failed_in_log,
            "acked": group in acked,
            "failed": group in failed,
        }
        for group in names
    }


def summary(entity: MessageEntity, now: float, preview_bytes: int) -> dict[str, Any]:
    """A row of `GET /messages`."""
    return {
        "message_id": entity.message_id,
        "topic": entity.topic,
        "message_type": entity.message_type,
        "producer_group": entity.producer_group,
        "state": state_of(entity, now),
        "created_at": entity.created_at,
        "deliver_count": entity.deliver_count,
        "next_deliver_at": None if entity.dead or not entity.commit else entity.next_deliver_at,
        "acked_groups": list(entity.succ_groups),
        "dead_reason": entity.dead_reason or None,
        "body": preview(entity, preview_bytes),
    }


def detail(
    entity: MessageEntity,
    routed: Iterable[str],
    now: float,
    preview_bytes: int,
    events: Sequence[Mapping[str, object]] = (),
) -> dict[str, Any]:
    """`GET /messages/{id}` of a stored message."""
    state = state_of(entity, now)
    dead = state is State.DEAD
    return {
        "message_id": entity.message_id,
        "state": state,
        "header": header(entity),
        "deliver_count": entity.deliver_count,
        "next_deliver_at": None if dead or state is State.UNCOMMITTED else entity.next_deliver_at,
        "dead_reason": entity.dead_reason if dead else None,
        "dead_at": entity.next_deliver_at if dead else None,  # dead_letter_many keeps the time there
        "groups": group_rows(entity, routed, events),
        "body": preview(entity, preview_bytes),
        "events": list(events),
    }


def finished(message_id: str, events: Sequence[Mapping[str, object]]) -> dict[str, Any]:
    """`GET /messages/{id}` of a message the store forgot but the delivery log saw."""
    first = events[0] if events else {}
    groups: dict[str, dict[str, bool]] = {}
    for event in events:
        group = event.get("group")
        if not group:
            continue
        row = groups.setdefault(
            str(group), {"routed": True, "delivered": False, "acked": False, "failed": False}
        )
        name = event.get("event")
        row["delivered"] = row["delivered"] or name in (LogEvent.DELIVERED, LogEvent.ACKED)
        if name == LogEvent.ACKED:
            row["acked"], row["failed"] = True, False
        elif name in FAILED_EVENTS:
            row["failed"] = True
    return {
        "message_id": message_id,
        "state": State.FINISHED,
        "header": {key: first.get(key) for key in ("topic", "message_type", "producer_group")},
        "groups": groups,
        "events": list(events),
    }


def clamp(value: int, default: int, most: int) -> int:
    """A query's size asked for, within 1..most (default when 0 or negative)."""
    return default if value <= 0 else min(value, most)
