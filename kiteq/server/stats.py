"""The per-group and per-topic rows of `/stats`, from the broker's counters. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def group_and_topic_rows(
    backlog: Mapping[str, int],
    connections: Mapping[str, int],
    lanes: Sequence[Mapping[str, Any]],
    counts: Mapping[tuple[str, str, str], int],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, int]]:
    """(groups, topics, event totals), sorted by name.

    Backlog is the store's committed, unfinished messages per topic; a group's backlog
    is that of the topics it is bound to (a message counts until every group has it).
    Event counts are cumulative: readers derive rates from two snapshots.
    """
    groups: dict[str, dict[str, Any]] = {}
    topics: dict[str, dict[str, Any]] = {}

    def group_row(group: str) -> dict[str, Any]:
        empty = {"connections": connections.get(group, 0), "inflight": 0, "queued": 0, "backlog": 0}
        return groups.setdefault(group, {**empty, "topics": [], "events": {}})

    def topic_row(topic: str) -> dict[str, Any]:
        return topics.setdefault(topic, {"backlog": backlog.get(topic, 0), "inflight": 0, "events": {}})

    for group in connections:
        group_row(group)
    for topic in backlog:
        topic_row(topic)
    for lane in lanes:
        row, topic = group_row(str(lane["group"])), str(lane["topic"])
        row["inflight"] += lane["inflight"]
        row["queued"] += lane["queued"]
        topic_row(topic)["inflight"] += lane["inflight"]
        if topic not in row["topics"]:
            row["topics"].append(topic)
            row["backlog"] += backlog.get(topic, 0)
    totals: dict[str, int] = {}
    for (event, topic, group), n in counts.items():
        totals[event] = totals.get(event, 0) + n
        by_topic = topic_row(topic)["events"]
        by_topic[event] = by_topic.get(event, 0) + n
        if group:
            by_group = group_row(group)["events"]
            by_group[event] = by_group.get(event, 0) + n
    return dict(sorted(groups.items())), dict(sorted(topics.items())), totals
