"""The broker's busiest thread, as versus_rabbitmq reports it per phase."""

from __future__ import annotations

import os
import threading
import time

import pytest

from benchmarks.versus_rabbitmq import ThreadTimes, busiest_thread, thread_times

SECOND = 1_000_000_000

CASES: list[tuple[str, ThreadTimes, ThreadTimes, float, tuple[float, float]]] = [
    (
        "the thread most on a CPU, not the one waiting most",
        {1: (0, 0), 2: (0, 0)},
        {1: (SECOND // 2, SECOND // 10), 2: (SECOND // 4, SECOND // 2)},
        1.0,
        (0.5, 0.1),
    ),
    ("shares of the seconds given", {1: (SECOND, SECOND)}, {1: (2 * SECOND, 3 * SECOND)}, 2.0, (0.5, 1.0)),
    (
        "a thread started since counts from zero",
        {1: (5 * SECOND, 0)},
        {1: (5 * SECOND, 0), 7: (SECOND // 5, SECOND // 20)},
        1.0,
        (0.2, 0.05),
    ),
    ("no threads: nothing", {}, {}, 1.0, (0.0, 0.0)),
]


@pytest.mark.parametrize(("why", "before", "after", "seconds", "expected"), CASES, ids=[c[0] for c in CASES])
def test_busiest_thread(
    why: str, before: ThreadTimes, after: ThreadTimes, seconds: float, expected: tuple[float, float]
) -> None:
    assert busiest_thread(before, after, seconds) == pytest.approx(expected)


def test_a_spinning_thread_is_on_a_cpu_or_waiting_for_one_all_along() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        before = thread_times(os.getpid())
        started = time.monotonic()
        time.sleep(0.3)
        after = thread_times(os.getpid())  # read while the spinner lives: an ended thread is gone
        seconds = time.monotonic() - started
    finally:
        stop.set()
        spinner.join()
    assert spinner.native_id in after
    on_cpu, waiting = busiest_thread(before, after, seconds)
    assert 0.8 <= on_cpu + waiting <= 1.2, (on_cpu, waiting)
