"""stores.schedule: when committed ids fall due, without walking what is not due. Pure."""

from __future__ import annotations

import pytest

from stores.schedule import Schedule, ScheduledCounts, bucket

T0 = 1_800_000_000.0


def schedule_of(times: dict[str, float]) -> tuple[Schedule[str], dict[str, float]]:
    schedule: Schedule[str] = Schedule()
    schedule.promote(T0, lambda message_id: None)
    for message_id, at in times.items():
        schedule.add(message_id, "t", at)
    return schedule, times


def promoted(schedule: Schedule[str], times: dict[str, float], now: float) -> list[str]:
    schedule.promote(now, lambda message_id: ("t", times[message_id]) if message_id in times else None)
    return list(schedule.walk(None, ()))


def test_ids_fall_due_in_time_and_walk_in_id_order() -> None:
    schedule, times = schedule_of({"c": T0 + 5, "a": T0 + 1, "b": T0 + 0.05, "d": T0 - 1})
    assert promoted(schedule, times, T0) == ["d"]
    assert promoted(schedule, times, T0 + 0.05) == ["b", "d"]
    assert promoted(schedule, times, T0 + 4.99) == ["a", "b", "d"]
    assert promoted(schedule, times, T0 + 5) == ["a", "b", "c", "d"]


def test_next_at_is_never_later_than_the_earliest_waiting_id() -> None:
    schedule, times = schedule_of({"far": T0 + 86_400 * 700, "near": T0 + 2.34})
    first = schedule.next_at()
    assert first is not None and T0 < first <= T0 + 2.34
    # Part of a bucket promoted: the rest of that bucket is still woken for, exactly.
    times["same-bucket"] = T0 + 2.38
    schedule.add("same-bucket", "t", times["same-bucket"])
    assert promoted(schedule, times, T0 + 2.35) == ["near"]
    assert schedule.next_at() == pytest.approx(T0 + 2.38)
    assert promoted(schedule, times, T0 + 2.38) == ["near", "same-bucket"]
    assert schedule.next_at() == bucket(T0 + 86_400 * 700) / 10


def test_a_rescheduled_or_removed_id_is_stale_in_its_old_bucket() -> None:
    schedule, times = schedule_of({"moved": T0 + 1, "gone": T0 + 1})
    times["moved"] = T0 + 10
    schedule.add("moved", "t", times["moved"])
    del times["gone"]
    assert promoted(schedule, times, T0 + 1) == []
    assert promoted(schedule, times, T0 + 10) == ["moved"]


def test_compaction_keeps_only_what_still_waits() -> None:
    schedule, times = schedule_of({str(i): T0 + 1 + i for i in range(5)})
    assert schedule.timers.slots == 5
    schedule.compact([("3", T0 + 4)])
    assert schedule.timers.slots == 1
    assert promoted(schedule, times, T0 + 10) == ["3"]


def test_parked_topics_are_not_walked() -> None:
    schedule: Schedule[str] = Schedule()
    schedule.add("x", "parked", T0)
    schedule.add("y", "live", T0)
    schedule.promote(T0, lambda message_id: ("parked" if message_id == "x" else "live", T0))
    assert list(schedule.walk(None, {"parked"})) == ["y"]


def test_counts_by_topic_and_hour_go_back_to_nothing() -> None:
    counts: ScheduledCounts[str] = ScheduledCounts()
    counts.add("t", T0 + 10)
    counts.add("t", T0 + 7200)
    assert counts.by_topic == {"t": 2}
    assert sum(counts.by_hour.values()) == 2 and len(counts.by_hour) == 2
    counts.remove("t", T0 + 10)
    counts.remove("t", T0 + 7200)
    assert not counts.by_topic and not counts.by_hour


def test_tidy_compacts_only_when_stale_ids_far_outnumber_the_stored() -> None:
    schedule, times = schedule_of({str(i): T0 + 1 + i for i in range(5000)})
    schedule.tidy(len(times), lambda: [])
    assert schedule.timers.slots == 5000, "as many slots as messages: nothing to drop"
    schedule.tidy(10, lambda: [("3", T0 + 4)])
    assert schedule.timers.slots == 1
