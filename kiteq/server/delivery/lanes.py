"""A lane per binding: a bounded queue of deliveries and its watermark.

The watermark is a count of the deliveries sent and not yet answered, so a group
never has more than `watermark` deliveries of that binding in flight (a counter, not
a `trio.CapacityLimiter`: the limiter's borrower bookkeeping showed per delivery in
profiles, and the lane's one pump is its only taker). The queue in front of it is
bounded too: when it is full the message is not queued at all — it stays in the
store, due, and the recover loop offers it again. That is what keeps the broker's
memory flat under any backlog.

The queue is a deque, not a memory channel: a channel's `receive` yields on every
item, and the pump would pay a trip through the scheduler per delivery.

A delivery offered while the pump waits for one, with nothing queued and a slot free,
may skip the queue (`take_slot_now`): its sender sends it at once, and the pump is not
woken for it. Woken, the pump would send it a turn of the event loop later, behind
everything else ready then; at 5,000 messages a second on two cores that turn was about
a quarter of a message's way from producer to consumer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from kiteq.registry.bindings import Binding
from kiteq.server.delivery.rounds import Round


@dataclass(eq=False, slots=True)
class Delivery:
    """One message pushed to one group; `settle` is called once with how it was answered."""

    round: Round
    lane: Lane
    group: str
    settle: Callable[[Delivery, bool, str], None]
    opaque: int = 0
    sent_at: float = 0.0

    # Written out: the generated one would stay interpreted (docs/design.md, "compiled
    # modules"), and a delivery is built for every message and group.
    def __init__(
        self,
        round: Round,
        lane: Lane,
        group: str,
        settle: Callable[[Delivery, bool, str], None],
        opaque: int = 0,
        sent_at: float = 0.0,
    ) -> None:
        self.round = round
        self.lane = lane
        self.group = group
        self.settle = settle
        self.opaque = opaque
        self.sent_at = sent_at

    def resolve(self, ok: bool, reason: str = "") -> None:
        self.settle(self, ok, reason)


@dataclass(eq=False)
class Lane:
    binding: Binding
    capacity: int
    starved: bool = False
    closed: bool = False
    inflight: int = 0
    _queue: deque[Delivery] = field(default_factory=deque, init=False, repr=False)
    _arrived: trio.Event = field(default_factory=trio.Event, init=False, repr=False)
    _freed: trio.Event = field(default_factory=trio.Event, init=False, repr=False)
    # A factory, not `default=False`: compiled, a field outside __init__ gets no default.
    _pump_waiting: bool = field(default_factory=bool, init=False, repr=False)

    @property
    def group(self) -> str:
        return self.binding.group

    @property
    def queued(self) -> int:
        return len(self._queue)

    def offer(self, delivery: Delivery) -> bool:
        """Queue without waiting; False when the lane is full or closed.

        A lane that refuses an offer, or that this offer fills, is marked starved: the
        store may hold more for it, so the recover loop is woken once it has room.
        """
        if self.closed or len(self._queue) >= self.capacity:
            self.starved = True
            return False
        self._queue.append(delivery)
        self._arrived.set()
        if len(self._queue) >= self.capacity:
            self.starved = True
        return True

    @property
    def room(self) -> int:
        """Deliveries the queue can still take."""
        return max(0, self.capacity - len(self._queue))

    async def next(self) -> Delivery | None:
        """The oldest queued delivery, without yielding if there is one; None once closed and empty."""
        while not self._queue:
            if self.closed:
                return None
            self._arrived = trio.Event()
            self._pump_waiting = True
            try:
                await self._arrived.wait()
            finally:
                self._pump_waiting = False
        return self._queue.popleft()

    def take_slot_now(self) -> bool:
        """Count a delivery in flight that skips the queue; False (nothing counted) unless
        the pump waits for a delivery, none is queued, and a slot is free: only then is
        sending it at once the same as the pump sending it next."""
        if self.closed or not self._pump_waiting or self._queue or self.inflight >= self.binding.watermark:
            return False
        self.inflight += 1
        return True

    async def take_slot(self) -> None:
        """Wait until fewer than `watermark` deliveries are in flight, then count one more."""
        while self.inflight >= self.binding.watermark:
            self._freed = trio.Event()
            await self._freed.wait()
        self.inflight += 1

    def free_slot(self) -> None:
        """A delivery was answered (or never sent)."""
        self.inflight -= 1
        self._freed.set()

    def rebind(self, binding: Binding) -> None:
        """Apply a changed watermark (or persistent flag) to the running lane."""
        self.binding = binding
        self._freed.set()

    def close(self) -> None:
        """No more offers; what is queued is given back by the pump, not sent."""
        self.closed = True
        self._arrived.set()
