"""The stores' count of waiting messages per key with the oldest one, under adds and removes."""

from __future__ import annotations

from stores.waiting import Waiting, WaitingTracker, summarize


def test_the_oldest_follows_removes_and_empty_keys_go() -> None:
    tracker: WaitingTracker[str] = WaitingTracker()
    for created_at in (30.9, 10.5, 20.0, 10.2):
        tracker.add("k", created_at)
    assert list(tracker.items()) == [("k", 4, 10.0)]
    tracker.remove("k", 10.5)
    assert list(tracker.items()) == [("k", 3, 10.0)], "another message of that second is still there"
    tracker.remove("k", 10.2)
    assert list(tracker.items()) == [("k", 2, 20.0)]
    tracker.remove("k", 20.0)
    tracker.remove("k", 30.9)
    assert list(tracker.items()) == []


def test_seconds_that_come_and_go_do_not_grow_the_heap() -> None:
    tracker: WaitingTracker[str] = WaitingTracker()
    tracker.add("k", 1.0)
    for second in range(2, 10_000):
        tracker.add("k", float(second))
        tracker.remove("k", float(second))
    assert list(tracker.items()) == [("k", 1, 1.0)]
    assert len(tracker._keys["k"].heap) <= 2 * 1 + 17


def test_parts_merge_by_topic_and_sorted_acked_groups() -> None:
    parts = [
        ("t", ("b", "a"), 2, 50.0),
        ("t", ("a", "b"), 1, 40.0),
        ("t", (), 3, 60.0),
        ("u", ("a",), 1, 5.0),
    ]
    assert summarize(parts) == [
        Waiting("t", (), 3, 60.0),
        Waiting("t", ("a", "b"), 3, 40.0),
        Waiting("u", ("a",), 1, 5.0),
    ]
