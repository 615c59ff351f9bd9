"""The /stats group and binding rows: backlog per group from what the store counts by acked groups."""

from __future__ import annotations

from typing import Any

import pytest

from kiteq.registry.bindings import Binding
from kiteq.server.stats import group_and_topic_rows, waiting_for
from protocol import BindType
from stores.waiting import Waiting

NOW = 10_000.0
# trade: 3 messages nobody acked (oldest 9,000), 2 that g1 acked (oldest 9,900), 1 that g1 and g2 acked.
WAITING = [
    Waiting("trade", (), 3, 9_000.0),
    Waiting("trade", ("g1",), 2, 9_900.0),
    Waiting("trade", ("g1", "g2"), 1, 9_990.0),
    Waiting("sms", ("g2",), 4, 9_500.0),
]


@pytest.mark.parametrize(
    ("group", "topic", "expected"),
    [
        ("g1", "trade", (3, 9_000.0)),
        ("g2", "trade", (5, 9_000.0)),
        ("g3", "trade", (6, 9_000.0)),
        ("g2", "sms", (0, None)),
        ("g1", "sms", (4, 9_500.0)),
        ("g1", "nothing", (0, None)),
    ],
)
def test_a_group_waits_for_the_messages_it_has_not_acked(
    group: str, topic: str, expected: tuple[int, float | None]
) -> None:
    assert waiting_for(group, topic, WAITING) == expected


def rows(
    bindings: list[Binding],
    connections: dict[str, int] | None = None,
    lanes: list[dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    groups, _, _ = group_and_topic_rows(
        bindings, WAITING, {"trade": 6, "sms": 4}, connections or {}, lanes or [], {}, NOW
    )
    return groups


def test_a_persistent_group_that_went_away_is_listed_by_name_with_its_backlog() -> None:
    gone = rows([Binding("g3", "trade", "pay", BindType.DIRECT)])["g3"]
    assert (gone["connections"], gone["online"], gone["backlog"]) == (0, False, 6)
    assert gone["oldest_waiting_age"] == 1_000.0
    assert gone["bindings"] == [
        {
            "topic": "trade",
            "message_type": "pay",
            "persistent": True,
            "backlog": 6,
            "inflight": 0,
            "queued": 0,
            "oldest_waiting_age": 1_000.0,
        }
    ]


def test_a_group_counts_each_topic_once_and_takes_lane_figures_per_binding() -> None:
    bindings = [
        Binding("g1", "trade", "pay", BindType.DIRECT),
        Binding("g1", "trade", "refund", BindType.DIRECT),
        Binding("g1", "sms", "*", BindType.FANOUT),
    ]
    lanes = [
        {"group": "g1", "topic": "trade", "message_type": "pay", "inflight": 2, "queued": 5},
        {"group": "g1", "topic": "sms", "message_type": "*", "inflight": 1, "queued": 0},
    ]
    g1 = rows(bindings, {"g1": 2}, lanes)["g1"]
    assert (g1["online"], g1["connections"], g1["inflight"], g1["queued"]) == (True, 2, 3, 5)
    assert g1["backlog"] == 3 + 4, "trade counted once though two bindings select from it"
    assert g1["oldest_waiting_age"] == 1_000.0
    assert [(b["message_type"], b["backlog"], b["inflight"], b["queued"]) for b in g1["bindings"]] == [
        ("pay", 3, 2, 5),
        ("refund", 3, 0, 0),
        ("*", 4, 1, 0),
    ]


def test_a_group_that_acked_everything_has_no_backlog_and_no_age() -> None:
    groups = rows([Binding("g2", "sms", "*", BindType.FANOUT)], {"producer": 1})
    assert (groups["g2"]["backlog"], groups["g2"]["oldest_waiting_age"]) == (0, None)
    assert groups["g2"]["bindings"][0]["oldest_waiting_age"] is None
    assert groups["producer"]["bindings"] == [] and groups["producer"]["online"] is True


def test_topics_keep_the_store_backlog_and_events_are_totalled() -> None:
    counts = {("acked", "trade", "g1"): 3, ("stored", "trade", ""): 5}
    groups, topics, totals = group_and_topic_rows([], WAITING, {"trade": 6}, {}, [], counts, NOW)
    assert topics["trade"]["backlog"] == 6 and topics["trade"]["events"] == {"acked": 3, "stored": 5}
    assert groups["g1"]["events"] == {"acked": 3} and totals == {"acked": 3, "stored": 5}
