"""A lane per binding: a bounded queue of deliveries and its watermark.

The watermark is a `trio.CapacityLimiter` held for as long as a delivery is
unacked, so a group never has more than `watermark` deliveries of that binding in
flight. The queue in front of it is bounded too: when it is full the message is not
queued at all — it stays in the store, due, and the recover loop offers it again.
That is what keeps the broker's memory flat under any backlog.

The queue is a deque, not a memory channel: a channel's `receive` yields on every
item, and the pump would pay a trip through the scheduler per delivery.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from kiteq.registry.bindings import Binding

if TYPE_CHECKING:
    from kiteq.server.delivery.dispatcher import Dispatcher
    from kiteq.server.delivery.rounds import Round


@dataclass(eq=False, slots=True)
class Delivery:
    """One message pushed to one group; the limiter token it holds is itself."""

    round: Round
    lane: Lane
    group: str
    owner: Dispatcher
    opaque: int = 0
    sent_at: float = 0.0
    deadline: float = math.inf

    def resolve(self, ok: bool, reason: str = "") -> None:
        self.owner.resolve(self, ok, reason)


@dataclass(eq=False)
class Lane:
    binding: Binding
    capacity: int
    limiter: trio.CapacityLimiter = field(init=False)
    starved: bool = False
    closed: bool = False

    def __post_init__(self) -> None:
        self.limiter = trio.CapacityLimiter(self.binding.watermark)
        self._queue: deque[Delivery] = deque()
        self._arrived = trio.Event()

    @property
    def group(self) -> str:
        return self.binding.group

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def inflight(self) -> int:
        return self.limiter.borrowed_tokens

    def offer(self, delivery: Delivery) -> bool:
        """Queue without waiting; False (and remember it) when the lane is full or closed."""
        if self.closed or len(self._queue) >= self.capacity:
            self.starved = True
            return False
        self._queue.append(delivery)
        self._arrived.set()
        return True

    async def next(self) -> Delivery | None:
        """The oldest queued delivery, without yielding if there is one; None once closed and empty."""
        while not self._queue:
            if self.closed:
                return None
            self._arrived = trio.Event()
            await self._arrived.wait()
        return self._queue.popleft()

    def rebind(self, binding: Binding) -> None:
        """Apply a changed watermark (or persistent flag) to the running lane."""
        self.binding = binding
        self.limiter.total_tokens = binding.watermark

    def close(self) -> None:
        """No more offers; what is queued is given back by the pump, not sent."""
        self.closed = True
        self._arrived.set()
