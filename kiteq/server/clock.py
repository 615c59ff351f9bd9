"""The wall clock the broker's rules read, injected so tests can move it.

Store times (next delivery, creation, expiry) are wall-clock seconds: they must mean
the same after a restart. Every rule that reads one takes a `WallClock` instead of
calling `time.time()`, so a test can drive it with Trio's autojump clock
(`trio_wall_clock`) instead of sleeping for real time to pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

WallClock = Callable[[], float]

system_clock: WallClock = time.time


def trio_wall_clock(epoch: float | None = None) -> WallClock:
    """A wall clock that follows Trio's clock (mock or autojump in tests) from `epoch`."""
    start = time.time() if epoch is None else epoch
    offset = start - trio.current_time()
    return lambda: offset + trio.current_time()
