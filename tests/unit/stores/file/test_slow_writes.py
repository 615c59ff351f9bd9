"""The rule for when writes in place pause after slow ones (`slow_writes.SlowWriteBudget`)."""

from __future__ import annotations

import pytest

from stores.file.slow_writes import BURST, LONGEST_PAUSE, SHARE, SLOW_WRITE, SlowWriteBudget


def write_whenever_allowed(took: float, seconds: float, interval: float = 0.001) -> tuple[float, int]:
    """A disk on which every write takes `took`, written in place whenever the budget
    allows, one write per `interval` at most, for `seconds`: (slow seconds, writes in place)."""
    budget, now, slow, writes = SlowWriteBudget(), 0.0, 0.0, 0
    while now < seconds:
        if budget.allows(now):
            now += took
            budget.charge(took, now)
            slow += took if took > SLOW_WRITE else 0.0
            writes += 1
        now += interval
    return slow, writes


@pytest.mark.parametrize(
    ("writes", "pause"),
    [
        ([0.0003] * 1000, 0.0),  # normal writes never pause
        ([SLOW_WRITE] * 1000, 0.0),  # at the limit: still normal
        ([0.003] * 6, 0.0),  # hiccups within the burst: no pause
        # The seventh overdraws the budget (less what the six refilled while they ran).
        ([0.003] * 7, (7 * 0.003 - BURST - 6 * 0.003 * SHARE) / SHARE),
        ([0.05], (0.05 - BURST) / SHARE),  # one slow write larger than the burst
        ([1.0], LONGEST_PAUSE),  # a stall pauses them for the longest
        ([120.0], LONGEST_PAUSE),
    ],
)
def test_writes_back_to_back_pause_once_their_slow_time_exceeds_the_burst(
    writes: list[float], pause: float
) -> None:
    budget, now, last = SlowWriteBudget(), 0.0, 0.0
    for took in writes:
        assert budget.allows(now)
        now += took
        last = budget.charge(took, now)
    assert last == pytest.approx(pause, abs=1e-9)
    assert budget.allows(now) is (pause == 0.0)
    assert budget.allows(now + pause + 1e-6), "the pause ends when it says"


def test_sporadic_hiccups_of_a_busy_disk_never_pause_writes_in_place() -> None:
    budget = SlowWriteBudget()
    for second in range(600):  # a 5 ms write once a second, for ten minutes
        now = float(second)
        assert budget.allows(now)
        assert budget.charge(0.005, now + 0.005) == 0.0


@pytest.mark.parametrize("took", [0.0021, 0.005, 0.01, 0.1, 0.29])
def test_slow_writes_take_the_burst_and_a_hundredth_of_the_time_at_most(took: float) -> None:
    seconds = 600.0
    slow, writes = write_whenever_allowed(took, seconds)
    assert writes > 1, "writes in place resume after each pause"
    assert slow <= BURST + SHARE * seconds + took


def test_a_stalled_write_pauses_writes_in_place_for_the_longest_then_they_resume() -> None:
    budget = SlowWriteBudget()
    assert budget.charge(600.0, 600.0) == LONGEST_PAUSE
    assert not budget.allows(600.0 + LONGEST_PAUSE - 1.0)
    assert budget.allows(600.0 + LONGEST_PAUSE + 1e-6)


def test_a_clock_stepping_back_refills_nothing() -> None:
    budget = SlowWriteBudget()
    pause = budget.charge(0.05, 100.0)
    assert not budget.allows(50.0)
    assert not budget.allows(100.0 + pause - 1e-3), "the step back gave nothing either"
