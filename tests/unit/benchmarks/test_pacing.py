"""The paced producers' alarm: a timerfd that goes off at a send's due time, never before."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator

import pytest
import trio

from benchmarks.clients.pacing import Alarm
from benchmarks.clients.workload import Sends


@pytest.fixture
def alarm() -> Iterator[Alarm]:
    alarm = Alarm()
    yield alarm
    alarm.close()


def readable(alarm: Alarm) -> bool:
    return bool(select.select([alarm.fd], [], [], 0)[0])


def test_an_alarm_goes_off_at_its_time_and_not_before(alarm: Alarm) -> None:
    async def wait() -> float:
        at = time.perf_counter() + 0.2  # far enough that a busy machine cannot pass it first
        alarm.set(at)
        assert not readable(alarm)
        await trio.lowlevel.wait_readable(alarm.fd)
        return time.perf_counter() - at

    assert trio.run(wait) >= 0
    alarm.clear()
    assert not readable(alarm)


def test_an_alarm_set_in_the_past_goes_off_at_once(alarm: Alarm) -> None:
    alarm.set(time.perf_counter() - 1)
    assert select.select([alarm.fd], [], [], 1)[0]


def test_a_later_set_replaces_the_earlier_one(alarm: Alarm) -> None:
    alarm.set(time.perf_counter() - 1)
    alarm.set(time.perf_counter() + 60)
    assert not readable(alarm)


def test_clearing_an_alarm_that_has_not_gone_off_is_harmless(alarm: Alarm) -> None:
    alarm.clear()
    assert not readable(alarm)


@pytest.mark.parametrize(
    ("rate", "index", "after_start"), [(1000.0, 5, 0.005), (5000.0, 1, 0.0002), (None, 7, 0.0)]
)
def test_a_send_is_due_index_over_rate_after_the_start(
    rate: float | None, index: int, after_start: float
) -> None:
    sends = Sends(10, rate, 0)
    assert sends.due_at(index) - sends.started == pytest.approx(after_start)


def test_a_paced_report_says_how_late_its_sends_left() -> None:
    sends = Sends(3, 1000.0, 0)
    sends.started = time.perf_counter() - 1.0  # sends due 1.000, 0.999 and 0.998 s ago
    for index in range(3):
        sends.left(index)
    report = sends.report()
    assert isinstance(report["late_p50_ms"], float)
    assert isinstance(report["late_p99_ms"], float)
    assert report["late_p50_ms"] >= 999.0
    assert report["late_p99_ms"] >= 1000.0


def test_an_unpaced_send_is_never_late() -> None:
    sends = Sends(3, None, 0)
    for index in range(3):
        sends.left(index)
    assert "late_p50_ms" not in sends.report()
