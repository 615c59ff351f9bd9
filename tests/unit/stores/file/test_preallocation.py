"""Segments zero-filled ahead: how their end and a torn write in them are told, the
writes' span, and the preparer (the writer with it: test_store.py, tests/faults)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from stores.file import layout
from stores.file.preallocation import WRITE_SPAN, Preparer, torn_write, zeros_start
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


def test_a_segment_asked_for_instead_is_prepared_and_the_other_deleted(tmp_path: Path) -> None:
    preparer = Preparer(tmp_path, 4 << 20)
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
    preparer = Preparer(tmp_path, 1 << 20)
    with capture_logs() as logs:
        preparer.request(2)
        wait_until(lambda: any(e["event"] == "store.preallocation_failed" for e in logs))
        preparer.stop()
    assert preparer.take(2) is None
    assert [e["segment"] for e in logs if e["event"] == "store.preallocation_failed"] == [2]
