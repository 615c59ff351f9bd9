"""Segments zero-filled ahead: how their end and a torn write in them are told, the
writes' span, and the preparer (the writer with it: test_store.py, tests/faults)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from stores.file import layout, preallocation
from stores.file.preallocation import (
    WRITE_SPAN,
    Preparer,
    pause_after_step,
    split_damage,
    step_due,
    torn_write,
    zeros_start,
)
from stores.file.records import Damage

SPAN = WRITE_SPAN


@pytest.mark.parametrize(
    ("damage", "zeros", "torn"),
    [
        (Damage(100, None, "bad magic"), None, True),  # nothing good after it: torn, zero-filled or not
        (Damage(100, 200, "CRC mismatch"), None, False),  # good records after it in an appended file
        (Damage(100, 200, "CRC mismatch"), 100 + SPAN, True),  # within the last write's span
        (Damage(100, 200, "CRC mismatch"), 101 + SPAN, False),  # further back: damage, not a crash
        (Damage(100, None, "CRC mismatch"), 101 + SPAN, True),
    ],
)
def test_a_torn_write_is_damage_with_nothing_good_after_it_or_within_the_last_span(
    damage: Damage, zeros: int | None, torn: bool
) -> None:
    assert torn_write(damage, zeros) is torn


TAIL = Damage(500, None, "bad magic")
MIDDLE = Damage(100, 200, "CRC mismatch")
NEAR_ZEROS = Damage(300, 400, "CRC mismatch")


@pytest.mark.parametrize(
    ("damages", "zeros", "last", "before", "torn"),
    [
        ([MIDDLE, NEAR_ZEROS], 300 + SPAN, True, [MIDDLE], NEAR_ZEROS),  # good records after it
        ([MIDDLE, NEAR_ZEROS], 300 + SPAN, False, [MIDDLE, NEAR_ZEROS], None),  # not the last file
        ([MIDDLE, TAIL], None, True, [MIDDLE], TAIL),  # an appended file's torn tail
        ([MIDDLE, TAIL], None, False, [MIDDLE, TAIL], None),  # a sealed file's: damage
        ([MIDDLE, NEAR_ZEROS], 301 + SPAN, True, [MIDDLE, NEAR_ZEROS], None),  # all further back
        ([], None, True, [], None),
    ],
)
def test_a_files_damage_ends_at_its_torn_write(
    damages: list[Damage], zeros: int | None, last: bool, before: list[Damage], torn: Damage | None
) -> None:
    assert split_damage(damages, zeros, last) == (before, torn)


def test_zeros_start_is_for_zero_filled_segments_only() -> None:
    records = b"r" * 50
    zero_filled = layout.file_head(layout.SEGMENT, 3, layout.ZERO_FILLED_VERSION) + records + bytes(4096)
    appended = layout.file_head(layout.SEGMENT, 3) + records + bytes(4096)
    assert zeros_start(zero_filled, layout.SEGMENT) == layout.HEAD_SIZE + 50
    assert zeros_start(appended, layout.SEGMENT) is None
    assert layout.head_problem(zero_filled, layout.SEGMENT, 3) is None
    log_head = layout.file_head(layout.LOG, 3, layout.ZERO_FILLED_VERSION)
    assert layout.head_problem(log_head, layout.LOG, 3) == (
        "format version 2 is not supported (this build reads version 1)"
    )


@pytest.mark.parametrize(
    ("sizes", "span", "calls"),
    [
        ([10, 10, 10], 0, [[10, 10, 10]]),
        ([10, 10, 10], 20, [[10, 10], [10]]),
        ([10, 10, 10], 19, [[10], [10], [10]]),
        ([50, 10, 10], 20, [[50], [10, 10]]),  # a chunk longer than the span goes alone
        ([5, 50], 20, [[5], [50]]),
    ],
)
def test_write_all_keeps_each_call_within_the_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes: list[int], span: int, calls: list[list[int]]
) -> None:
    seen: list[list[int]] = []
    real = os.pwritev

    def pwritev(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
        seen.append([len(buffer) for buffer in buffers])
        return real(fd, buffers, offset, flags)

    monkeypatch.setattr(os, "pwritev", pwritev)
    chunks = [bytes([i + 1]) * size for i, size in enumerate(sizes)]
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        assert layout.write_all(fd, chunks, 0, span=span) == sum(sizes)
    finally:
        os.close(fd)
    assert seen == calls
    assert (tmp_path / "f").read_bytes() == b"".join(chunks)


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.001)


def needed_now(number: int) -> float:
    """Writes need every segment asked for at once: it is filled flat out."""
    return 1.0


@pytest.mark.parametrize(
    ("writer_at", "writer_rate", "filled", "fill_rate", "due", "why"),
    [
        (1.0, 0.5, 0.2, 1.0, True, "writes need it now"),
        (0.5, 0.1, 0.2, 1.0, True, "writes are halfway through the one before"),
        (0.1, 0.1, 0.0, 0.0, True, "its speed is not known before its first step"),
        (0.1, 0.0, 0.2, 1.0, True, "writes stand still: nothing to disturb"),
        # 5,000 messages a second: a segment in 12 s; flat out, filling the rest takes 0.8 s.
        (0.1, 1 / 12, 0.2, 1.0, False, "4.8 s before writes are halfway, 1.2 s of work"),
        (0.45, 1 / 12, 0.2, 1.0, True, "0.6 s before writes are halfway, 1.2 s of work"),
        # 50,000 a second: a segment in 1.2 s, faster than a fill goes.
        (0.1, 1 / 1.2, 0.2, 1.0, True, "0.48 s left, 1.2 s of work: flat out"),
    ],
)
def test_a_fill_steps_when_finishing_by_halfway_needs_it(
    writer_at: float, writer_rate: float, filled: float, fill_rate: float, due: bool, why: str
) -> None:
    assert step_due(writer_at, writer_rate, filled, fill_rate) is due, why


@pytest.mark.parametrize(
    ("writer_at", "pause", "why"),
    [
        (0.0, preallocation.FILL_PAUSE, "writes have just begun the segment before: on time"),
        (preallocation.DONE_BY - 0.01, preallocation.FILL_PAUSE, "not yet due to be done"),
        (preallocation.DONE_BY, 0.0, "due to be done: late"),
        (1.0, 0.0, "writes need it, or append while they wait for it"),
    ],
)
def test_a_fill_pauses_after_each_step_only_while_on_time(writer_at: float, pause: float, why: str) -> None:
    assert pause_after_step(writer_at) == pause, why


def test_a_late_fill_does_not_pause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preallocation, "FILL_PAUSE", 30.0)  # one pause outlasts the wait (10 s)
    preparer = Preparer(tmp_path, 8 * preallocation.FILL_STEP, lambda number: preallocation.DONE_BY)
    try:
        preparer.request(2)
        wait_until(lambda: preparer.ready == 2)
    finally:
        preparer.stop()


def watched_fill(
    tmp_path: Path, size: int, writer_at: Callable[[], float]
) -> tuple[Preparer, dict[str, int]]:
    """A preparer of segment 2, the writer's progress toward it given by `writer_at`."""
    looks = {"count": 0}

    def progress(number: int) -> float:
        assert number == 2
        looks["count"] += 1
        return writer_at()

    preparer = Preparer(tmp_path, size, progress)
    preparer.request(2)
    return preparer, looks


def test_a_fill_waits_while_writes_go_slowly_and_goes_on_once_they_need_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preallocation, "PACE_CHECK", 0.001)
    began = time.monotonic()
    needed = {"now": False}

    def writer_at() -> float:  # a hundredth of a segment a second, until it needs the next
        return 1.0 if needed["now"] else 0.01 * (time.monotonic() - began)

    size = 8 * preallocation.FILL_STEP
    temporary = tmp_path / "0000000002.seg.tmp"
    preparer, looks = watched_fill(tmp_path, size, writer_at)
    try:
        wait_until(lambda: looks["count"] >= 5)
        seen = looks["count"]
        wait_until(lambda: looks["count"] >= seen + 200)  # past RECENT: the rate is known
        assert temporary.stat().st_size == preallocation.FILL_STEP, "one step (its speed), then it waits"
        assert preparer.ready is None
        needed["now"] = True
        wait_until(lambda: preparer.ready == 2)
        assert temporary.stat().st_size == size
    finally:
        preparer.stop()


def test_a_fill_goes_flat_out_while_writes_stand_still(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preallocation, "PACE_CHECK", 0.001)
    preparer, _ = watched_fill(tmp_path, 8 * preallocation.FILL_STEP, lambda: 0.1)
    try:
        wait_until(lambda: preparer.ready == 2)
    finally:
        preparer.stop()


def test_a_segment_asked_for_instead_is_prepared_and_the_other_deleted(tmp_path: Path) -> None:
    preparer = Preparer(tmp_path, 4 << 20, needed_now)
    try:
        preparer.request(2)
        preparer.request(3)
        wait_until(lambda: preparer.ready == 3)
        assert preparer.take(2) is None
        assert sorted(p.name for p in tmp_path.iterdir()) == ["0000000003.seg.tmp"]
        fd = preparer.take(3)
        assert fd is not None
        os.close(fd)
        data = (tmp_path / "0000000003.seg").read_bytes()
        assert len(data) == 4 << 20 and layout.head_problem(data, layout.SEGMENT, 3) is None
        assert layout.zero_filled(data) and data.count(0, layout.HEAD_SIZE) == len(data) - layout.HEAD_SIZE
    finally:
        preparer.stop()


def test_a_segment_that_cannot_be_prepared_is_logged_and_not_offered(tmp_path: Path) -> None:
    (tmp_path / "0000000002.seg.tmp").mkdir()  # in the way of the file it would write
    preparer = Preparer(tmp_path, 1 << 20, needed_now)
    with capture_logs() as logs:
        preparer.request(2)
        wait_until(lambda: any(e["event"] == "store.preallocation_failed" for e in logs))
        preparer.stop()
    assert preparer.take(2) is None
    assert [e["segment"] for e in logs if e["event"] == "store.preallocation_failed"] == [2]
