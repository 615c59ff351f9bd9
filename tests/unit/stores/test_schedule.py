"""stores.schedule: when committed ids fall due, without walking what is not due. Pure."""

from __future__ import annotations

from collections import Counter

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
    schedule.promote(now, times.get)
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
    assert schedule.slots == 5
    schedule.compact([("3", "t", T0 + 4), ("gone-due", "t", T0 - 1)])
    assert schedule.slots == 1, "what is already due is not waited for"
    assert promoted(schedule, times, T0 + 10) == ["3"]


def test_a_parked_topic_is_neither_promoted_nor_woken_for_until_unparked() -> None:
    schedule: Schedule[str] = Schedule()
    times = {"x": T0, "y": T0, "x-later": T0 + 5}
    for message_id, at in times.items():
        schedule.add(message_id, "parked" if message_id.startswith("x") else "live", at)
    assert schedule.promote(T0 + 10, times.get, parked={"parked"})
    assert list(schedule.walk(None, {"parked"})) == ["y"]
    assert schedule.slots == 2, "the parked topic's ids still wait in their buckets"
    assert schedule.next_at() is None, "nothing to wake for but the parked topic"
    assert schedule.promote(T0 + 10, times.get)
    assert list(schedule.walk(None, ())) == ["x", "x-later", "y"]
    assert schedule.slots == 0


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
    assert schedule.slots == 5000, "as many slots as messages: nothing to drop"
    schedule.tidy(10, lambda: [("3", "t", T0 + 4)])
    assert schedule.slots == 1


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 1000])
def test_a_limited_promotion_goes_on_where_it_stopped_and_misses_nothing(limit: int) -> None:
    times = {f"{i:03}": T0 + (i % 7) * 0.1 + (0.05 if i % 3 else 0.0) for i in range(40)}
    times["late"] = T0 + 30
    schedule, _ = schedule_of(times)
    for topic_id in ("u1", "u2"):
        times[topic_id] = T0 + 0.3
        schedule.add(topic_id, "u", times[topic_id])
    largest_bucket = max(Counter(bucket(at) for at in times.values()).values()) + 1  # + one added
    calls, before = 1, schedule.slots
    while not schedule.promote(T0 + 10, times.get, limit=limit):
        assert before - schedule.slots < limit + largest_bucket, (
            "a step looks at whole buckets up to the limit"
        )
        calls += 1
        assert schedule.next_at() is not None and schedule.next_at() <= T0 + 10, "woken for the rest at once"
        added = f"added-{calls:03}"  # arriving between steps, due at once
        times[added] = T0 + 1
        schedule.add(added, "t", times[added])
        before = schedule.slots
    assert (calls > 1) == (limit < 40)
    walked = list(schedule.walk(None, ()))
    assert walked == sorted(message_id for message_id, at in times.items() if at <= T0 + 10)
    assert schedule.next_at() == pytest.approx(T0 + 30)
    assert schedule.slots == 1
