"""Refusals (failed logins, evicted or broken connections, foreign decisions), logged in bounded volume.

A peer can make the broker refuse it as often as it can open a socket. Logging each
refusal would let it write the broker's disk full; logging none would hide an attack.
So the first refusal of each kind in a window is logged in full, the others of that
window are counted, and one summary line per kind says how many there were. The
counter is pure (the caller passes the time); `RefusalLog` is the thin glue that logs.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import structlog
import trio

log = structlog.get_logger(__name__)

WINDOW = 10.0


class RefusalCounter:
    """Per kind: is this refusal the first of its window, and how many were not logged."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self.totals: Counter[str] = Counter()
        self._logged_at: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def note(self, kind: str, now: float) -> bool:
        """Count a refusal of `kind`; True when it should be logged in full."""
        self.totals[kind] += 1
        logged_at = self._logged_at.get(kind)
        if logged_at is None or now - logged_at >= self.window:
            self._logged_at[kind] = now
            return True
        self._suppressed[kind] += 1
        return False

    def take_suppressed(self) -> dict[str, int]:
        """The refusals counted but not logged since the last call, by kind."""
        suppressed, self._suppressed = dict(self._suppressed), Counter()
        return suppressed


class RefusalLog:
    """Logs through a RefusalCounter; `run` writes the summaries once per window."""

    def __init__(self, window: float = WINDOW) -> None:
        self.counter = RefusalCounter(window)

    def refused(self, kind: str, **fields: Any) -> None:
        if self.counter.note(kind, time.monotonic()):
            log.warning(kind, **fields)

    @property
    def totals(self) -> dict[str, int]:
        return dict(self.counter.totals)

    async def run(self) -> None:
        while True:
            await trio.sleep(self.counter.window)
            self.flush()

    def flush(self) -> None:
        for kind, count in self.counter.take_suppressed().items():
            log.warning("refusals.summary", kind=kind, not_logged=count, window_seconds=self.counter.window)
