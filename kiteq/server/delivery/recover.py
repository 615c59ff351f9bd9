"""The recover loop: pages through due messages in the store and offers them again.

It is what resumes deliveries after a restart, retries after backoff, and feeds a
group whose lane was full or whose consumers were offline. A pass that places
nothing makes the next wait longer (up to `MAX_IDLE`), so an offline group's backlog
is not rescanned in a tight loop; consumers connecting, bindings changing and lanes
freeing up wake it at once.
"""

from __future__ import annotations

import time

import structlog
import trio

from kiteq.config import DeliveryConfig
from kiteq.server.delivery.dispatcher import Dispatcher
from stores import MessageStore, StoreError

log = structlog.get_logger(__name__)

MAX_IDLE = 30.0
MIN_GAP = 0.05


class RecoverLoop:
    def __init__(self, store: MessageStore, dispatcher: Dispatcher, config: DeliveryConfig) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.config = config
        self._wakeup = trio.Event()
        self.passes = 0

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self) -> None:
        idle = self.config.recover_interval
        while True:
            try:
                placed = await self.run_pass()
            except StoreError as exc:
                log.warning("recover.store_error", error=str(exc))
                placed = 0
            idle = self.config.recover_interval if placed else min(idle * 2, MAX_IDLE)
            await trio.sleep(MIN_GAP)
            with trio.move_on_after(idle):
                await self._wakeup.wait()
            self._wakeup = trio.Event()

    async def run_pass(self) -> int:
        """Offer every due message once; the number of messages sent to at least one group."""
        now = time.time()
        cursor = None
        placed = 0
        while True:
            page = await self.store.page_due(now, cursor, self.config.recover_page)
            for entity in page.items:
                placed += self.dispatcher.submit(entity)
            if page.cursor is None:
                break
            cursor = page.cursor
        self.passes += 1
        return placed
