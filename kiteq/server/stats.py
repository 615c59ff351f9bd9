"""The per-group, per-binding and per-topic rows of `/stats`, from the broker's counters. Pure.

A group's backlog is what *it* still waits for: committed, live messages of its bound
topics that it has not acked (the store counts them by topic and by the groups that
acked them, `StoreStats.waiting`). Every binding the registry holds is listed, so a
persistent group that went away (no connection, no lane) still shows, by name, the
messages kept for it. The store does not count by message type: a binding that selects
some types of a topic is shown the topic's messages the group has not acked, those
routed only to other groups included while those groups still hold them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kiteq.registry.bindings import Binding
from stores.schedule import HOUR
from stores.waiting import Waiting


def waiting_for(group: str, topic: str, waiting: Iterable[Waiting]) -> tuple[int, float | None]:
    """(messages of `topic` that `group` has not acked, the oldest one's created_at or None)."""
    count, oldest = 0, None
    for row in waiting:
        if row.topic == topic and group not in row.acked:
            count += row.messages
            oldest = row.oldest if oldest is None else min(oldest, row.oldest)
    return count, oldest


def _age(oldest: float | None, now: float) -> float | None:
    return None if oldest is None else round(max(0.0, now - oldest), 3)


def group_and_topic_rows(
    bindings: Sequence[Binding],
    waiting: Sequence[Waiting],
    backlog: Mapping[str, int],
    connections: Mapping[str, int],
    lanes: Sequence[Mapping[str, Any]],
    counts: Mapping[tuple[str, str, str], int],
    now: float,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, int]]:
    """(groups, topics, event totals), sorted by name.

    A group row: `connections`, `online`, `inflight`, `queued`, `backlog` (over its distinct
    topics), `oldest_waiting_age` (seconds, None when nothing waits), `topics`, `events`
    and `bindings` (one row per binding: topic, message_type, persistent, backlog,
    inflight, queued, oldest_waiting_age). Groups come from bindings, connections and
    lanes. Event counts are cumulative: readers derive rates from two snapshots.
    """
    groups: dict[str, dict[str, Any]] = {}
    topics: dict[str, dict[str, Any]] = {}
    by_topic: dict[str, list[Waiting]] = {}
    for part in waiting:
        by_topic.setdefault(part.topic, []).append(part)

    def group_row(group: str) -> dict[str, Any]:
        found = groups.get(group)
        if found is None:
            n = connections.get(group, 0)
            found = groups[group] = {
                "connections": n,
                "online": n > 0,
                "inflight": 0,
                "queued": 0,
                "backlog": 0,
                "oldest_waiting_age": None,
                "topics": [],
                "events": {},
                "bindings": [],
            }
        return found

    def topic_row(topic: str) -> dict[str, Any]:
        return topics.setdefault(topic, {"backlog": backlog.get(topic, 0), "inflight": 0, "events": {}})

    def add_topic(row: dict[str, Any], group: str, topic: str) -> tuple[int, float | None]:
        count, oldest = waiting_for(group, topic, by_topic.get(topic, ()))
        if topic not in row["topics"]:
            row["topics"].append(topic)
            row["backlog"] += count
            age, known = _age(oldest, now), row["oldest_waiting_age"]
            if age is not None and (known is None or age > known):
                row["oldest_waiting_age"] = age
        return count, oldest

    for group in connections:
        group_row(group)
    for topic in backlog:
        topic_row(topic)
    lane_of = {(str(lane["group"]), str(lane["topic"]), str(lane["message_type"])): lane for lane in lanes}
    for binding in bindings:
        row = group_row(binding.group)
        count, oldest = add_topic(row, binding.group, binding.topic)
        lane = lane_of.get((binding.group, binding.topic, binding.message_type), {})
        row["bindings"].append(
            {
                "topic": binding.topic,
                "message_type": binding.message_type,
                "persistent": binding.persistent,
                "backlog": count,
                "inflight": lane.get("inflight", 0),
                "queued": lane.get("queued", 0),
                "oldest_waiting_age": _age(oldest, now),
            }
        )
    for lane in lanes:
        row, topic = group_row(str(lane["group"])), str(lane["topic"])
        row["inflight"] += lane["inflight"]
        row["queued"] += lane["queued"]
        topic_row(topic)["inflight"] += lane["inflight"]
        add_topic(row, str(lane["group"]), topic)
    totals: dict[str, int] = {}
    for (event, topic, group), n in counts.items():
        totals[event] = totals.get(event, 0) + n
        by_event = topic_row(topic)["events"]
        by_event[event] = by_event.get(event, 0) + n
        if group:
            by_group = group_row(group)["events"]
            by_group[event] = by_group.get(event, 0) + n
    return dict(sorted(groups.items())), dict(sorted(topics.items())), totals


SCHEDULED_HOURS_SHOWN = 48


def scheduled_summary(by_topic: Mapping[str, int], by_hour: Mapping[int, int], now: float) -> dict[str, Any]:
    """Delayed messages not yet delivered: per topic, and per hour they fall due in.

    The first SCHEDULED_HOURS_SHOWN hours from the current one are listed (an hour already
    begun counts what is due in it or overdue); what falls due after them is summed in
    `later`, so the answer stays small however far ahead messages are scheduled.
    """
    first_hour = int(now // HOUR) * HOUR
    last_shown = first_hour + (SCHEDULED_HOURS_SHOWN - 1) * HOUR
    hours: dict[int, int] = {}
    later = 0
    for start, count in by_hour.items():
        if start > last_shown:
            later += count
        else:
            key = max(start, first_hour)
            hours[key] = hours.get(key, 0) + count
    return {
        "total": sum(by_topic.values()),
        "by_topic": dict(sorted(by_topic.items())),
        "by_hour": [
            {"hour": time.strftime("%Y-%m-%dT%H:00Z", time.gmtime(start)), "start": start, "count": count}
            for start, count in sorted(hours.items())
        ],
        "later": later,
    }
