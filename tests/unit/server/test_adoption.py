"""When a live broker takes over a dead one's rows (the sans-IO part of kiteq/server/adoption.py)."""

from __future__ import annotations

from kiteq.server.adoption import AbsenceTracker

ME, OTHER, GONE = "10.0.0.1:13800", "10.0.0.2:13800", "10.0.0.3:13800"


def test_an_owner_is_adopted_only_after_adopt_after_of_continuous_absence() -> None:
    tracker = AbsenceTracker(ME, adopt_after=60.0)
    owners = {ME, OTHER, GONE}
    assert tracker.observe(0.0, owners, live={ME, OTHER}) == []
    assert tracker.observe(59.0, owners, live={ME, OTHER}) == []
    assert tracker.observe(60.0, owners, live={ME, OTHER}) == [GONE]


def test_reappearing_resets_the_clock() -> None:
    tracker = AbsenceTracker(ME, adopt_after=60.0)
    owners = {ME, GONE}
    tracker.observe(0.0, owners, live={ME})
    tracker.observe(50.0, owners, live={ME, GONE})
    assert tracker.observe(70.0, owners, live={ME}) == []
    assert tracker.observe(130.0, owners, live={ME}) == [GONE]


def test_an_unreadable_registry_proves_nothing() -> None:
    tracker = AbsenceTracker(ME, adopt_after=10.0)
    tracker.observe(0.0, {ME, GONE}, live={ME})
    tracker.unknown()
    assert tracker.observe(15.0, {ME, GONE}, live={ME}) == []
    assert tracker.observe(25.0, {ME, GONE}, live={ME}) == [GONE]


def test_never_adopts_itself_or_ownerless_rows() -> None:
    tracker = AbsenceTracker(ME, adopt_after=0.0)
    assert tracker.observe(0.0, {ME, ""}, live=set()) == []


def test_adopted_owner_starts_over_if_its_rows_return() -> None:
    tracker = AbsenceTracker(ME, adopt_after=5.0)
    tracker.observe(0.0, {ME, GONE}, live={ME})
    assert tracker.observe(5.0, {ME, GONE}, live={ME}) == [GONE]
    tracker.adopted(GONE)
    assert tracker.observe(6.0, {ME, GONE}, live={ME}) == []
