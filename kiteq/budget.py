"""A ceiling on work in flight that costs no checkpoint while there is room.

A reader takes from the budget for each request it hands to a task, and the task
gives back when it is done. Unlike `trio.CapacityLimiter`, `take` does not yield
when the work fits, so a burst of frames is handed out in one pass of the reader;
at the ceiling the reader waits, stops reading, and TCP slows the peer down.
"""

from __future__ import annotations

import trio


class Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting = 0
        self._changed = trio.Event()

    async def take(self, weight: int = 1) -> None:
        """Wait until `weight` more fits; anything fits while nothing is in use."""
        while self.used and self.used + weight > self.limit:
            await self._wait()
        self.used += weight

    def give(self, weight: int = 1) -> None:
        self.used -= weight
        if self._waiting:
            self._changed.set()
            self._changed = trio.Event()

    async def wait_empty(self) -> None:
        """Until everything taken has been given back."""
        while self.used:
            await self._wait()

    async def _wait(self) -> None:
        self._waiting += 1
        try:
            await self._changed.wait()
        finally:
            self._waiting -= 1
