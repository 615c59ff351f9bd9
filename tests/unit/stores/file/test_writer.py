"""The rule for how long writes in place pause after a slow one (`writer.inline_pause`)."""

from __future__ import annotations

import pytest

from stores.file.writer import INLINE_PAUSE_MAX, INLINE_WRITE_LIMIT, inline_pause


@pytest.mark.parametrize(
    ("took", "pause"),
    [
        (0.0003, 0.0),  # a normal write: no pause
        (INLINE_WRITE_LIMIT, 0.0),  # at the limit: still none
        (0.003, 0.3),  # a hiccup pauses them briefly
        (0.05, 5.0),
        (1.0, INLINE_PAUSE_MAX),  # a stall pauses them for the longest
        (120.0, INLINE_PAUSE_MAX),
    ],
)
def test_a_slow_write_pauses_writes_in_place_a_hundred_times_as_long(took: float, pause: float) -> None:
    assert inline_pause(took, INLINE_WRITE_LIMIT) == pytest.approx(pause)


def test_the_loop_is_held_up_by_slow_writes_at_most_a_hundredth_of_the_time() -> None:
    for took in (0.0021, 0.01, 0.1, 0.29):
        assert took / (took + inline_pause(took, INLINE_WRITE_LIMIT)) <= 0.01
