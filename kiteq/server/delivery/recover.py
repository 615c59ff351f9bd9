"""The recover loop: pages through due messages in the store and offers them again.

It is what resumes deliveries after a restart, retries after backoff, and feeds a
group whose lane was full or whose consumers were offline. Topics whose groups are
all persistent and offline are parked: not paged at all until a consumer connects
(which wakes the loop), so an offline group's backlog costs no CPU. A pass that places
nothing makes the next wait longer (up to `MAX_IDLE`), so an offline group's backlog
is not rescanned in a tight loop; consumers connecting, bindings changing and lanes
freeing up wake it at once, and every retry the dispatcher schedules is remembered
(to DUE_RESOLUTION) so a pass runs when it falls due, however idle the loop is. After
each pass the store says when its next waiting message falls due (a retry, or a delayed
message however far ahead), so the loop also wakes for what it was never told of: what
was stored before a restart, or more wake-ups than it keeps (MAX_TICKS).
"""

from __future__ import annotations

import math

import structlog
import trio

from kiteq.config import DeliveryConfig
from kiteq.server.clock import WallClock
from kiteq.server.delivery.dispatcher import Dispatcher
from stores import MessageStore, StoreError

log = structlog.get_logger(__name__)

MAX_IDLE = 30.0
MIN_GAP = 0.05
DUE_RESOLUTION = 0.05  # retries falling due this close together share one pass
MAX_TICKS = 1024  # wake-ups remembered; later ones are found again through the store
# A page is offered in bursts of this many, with the other ready tasks run in between: acks
# that free watermark slots and the pump that refills them wait a burst, not a whole page.
SUBMIT_BURST = 64
# Wall-clock times near 1.8e9 carry about 0.2 µs of rounding (0.4 s from now reads
# 0.4000001): a time within half of this after a tick counts as that tick, and the loop
# wakes this long after a tick, so it never wakes before a time it was asked for.
CLOCK_SLACK = 1e-6


class RecoverSignal:
    """When the recover loop should run next: at once (`wake`) or when a retry falls due.

    Made before the loop and the dispatcher, so the dispatcher is given `wake` and
    `retry_at` as its hooks when it is constructed.
    """

    def __init__(self, clock: WallClock) -> None:
        self.clock = clock
        self._event = trio.Event()
        self._woken = False
        self._due_ticks: set[int] = set()

    def wake(self) -> None:
        self._woken = True
        self._event.set()

    def retry_at(self, when: float) -> None:
        """A retry falls due at wall-clock time `when`: a pass will run then."""
        at = trio.current_time() + max(0.0, when - self.clock()) - CLOCK_SLACK / 2
        tick = math.ceil(at / DUE_RESOLUTION)
        if tick not in self._due_ticks:
            self._due_ticks.add(tick)
            if len(self._due_ticks) > 2 * MAX_TICKS:
                self._due_ticks = set(sorted(self._due_ticks)[:MAX_TICKS])
            self._event.set()

    def forget_past(self) -> None:
        now = trio.current_time()
        self._due_ticks = {tick for tick in self._due_ticks if tick * DUE_RESOLUTION > now}

    async def wait(self, idle: float) -> None:
        """Until `idle` passes, `wake()` is called, or the next retry falls due."""
        until = trio.current_time() + idle
        while not self._woken:
            deadline = min(until, min(self._due_ticks, default=math.inf) * DUE_RESOLUTION + CLOCK_SLACK)
            if trio.current_time() >= deadline:
                break
            self._event = trio.Event()
            with trio.move_on_at(deadline):
                await self._event.wait()
        self._woken = False


class RecoverLoop:
    def __init__(
        self, store: MessageStore, dispatcher: Dispatcher, config: DeliveryConfig, signal: RecoverSignal
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.config = config
        self.signal = signal
        self.passes = 0
        self._resume: str | None = None  # where the last pass stopped, if it stopped early

    async def run(self) -> None:
        idle = self.config.recover_interval
        while True:
            self.signal.forget_past()
            try:
                placed = await self.run_pass()
                next_due = await self.store.next_due_at(self.signal.clock())
                if next_due is not None:
                    self.signal.retry_at(next_due)
            except StoreError as exc:
                log.warning("recover.store_error", error=str(exc))
                placed = 0
            idle = self.config.recover_interval if placed else min(idle * 2, MAX_IDLE)
            await trio.sleep(MIN_GAP)
            await self.signal.wait(idle)

    async def run_pass(self) -> int:
        """Offer due messages, in id order, until a page places none (or every lane is full).

        A pass then costs what it places, not the whole backlog: with one slow group's
        lane full, each slot it frees wakes a pass, and a pass that walked everything
        owed to it would cost O(backlog) per slot. The next pass resumes where this one
        stopped, and a pass that resumed goes round to the start when it reaches the
        end, so every due message is reached in turn and none waits for a later look
        while its lane has room. A page is no larger than the most room a lane has: what
        cannot be placed is not read. The number of messages sent to at least one group.
        """
        now = self.signal.clock()
        cursor, self._resume = self._resume, None
        wrapped = cursor is None
        placed = 0
        parked = self.dispatcher.parked_topics()
        while (room := self.dispatcher.room(self.config.recover_page)) > 0:
            # What was cancelled before this read is gone from the page; what is cancelled
            # while the page is offered is withdrawn from it (see Dispatcher.withdrawn).
            self.dispatcher.withdrawn.clear()
            page = await self.store.page_due(now, cursor, room, self.dispatcher.rounds, parked)
            placed_here = 0
            for offered, entity in enumerate(page.items, 1):
                placed_here += self.dispatcher.submit(entity)
                if offered % SUBMIT_BURST == 0:
                    await trio.lowlevel.checkpoint()
            placed += placed_here
            if page.items and not placed_here:
                self._resume = page.cursor
                break
            if page.cursor is None:
                if wrapped:
                    break
                wrapped = True  # resumed mid-way: what lies before where it began is due too
            cursor = page.cursor
        else:
            self._resume = cursor  # every lane is full: go on from here once one has room
        self.passes += 1
        return placed
