"""Many sends in flight from one task: what `Producer.pipeline` returns.

Awaiting each `send` in a task of its own keeps many sends in flight too, but every
message then costs its task two turns of the event loop (send, then wake on the
store-ack), a large part of a busy producer's CPU. Here one task sends and the
store-acks are handed to a callback as they are read: a fifth to a third less CPU per
message at 100 in flight (docs/performance-history.md), the way RocketMQ's async send and
AMQP's publisher confirms work.

A window that was full and reopens is refilled by a burst of sends, one per answer
read. Those go out together, in one write of the connection's writer task, instead of
one write each from the sender's task: unthrottled at 100 in flight, 17 % more
messages a second end to end and a fifth less of the broker's CPU per message, which
reads them in one go (docs/performance-history.md, "A refilled window's sends written
together"). A send that finds room without waiting, as paced ones do, is written at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from types import TracebackType

import trio

from kiteq.client.message import Message
from kiteq.errors import SendError

OnResult = Callable[[Message, SendError | None], None]
# Sends `message` (compressed or not) and returns once it is on its way; the callback gets
# its outcome, exactly once (None: stored). If it raises, it does so before the message is
# on its way, and the callback is never called. The last argument, `at_once`: False leaves
# the message for the connection's writer, with whatever else is sent before it runs.
# `Producer._store_nowait`.
StoreNowait = Callable[[Message, bool, Callable[[SendError | None], None], bool], Awaitable[None]]


class SendPipeline:
    """Keeps up to `window` sends awaiting their store-acks, all sent from one task.

    `async with producer.pipeline(on_result, window=100) as pipeline:` then
    `await pipeline.send(message)` returns once the message is on its way: it waits only
    while `window` sends await their acks. `on_result(message, error)` gets each message's
    outcome, `error` None once a broker stored it, else the SendError `Producer.send` would
    have raised; resending the same message (same id) is safe. It is called from the
    connection's own task, so it must not block; if it raises, the next `send` (or leaving
    the block) raises that. Leaving the block waits until every message sent has its result.
    """

    def __init__(self, store: StoreNowait, on_result: OnResult, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self._store = store
        self._on_result = on_result
        self.window = window
        self.in_flight = 0
        self._refilling = 0  # sends still to come in the burst that refills a reopened window
        self._answered: trio.Event | None = None
        self._failure: BaseException | None = None

    async def __aenter__(self) -> SendPipeline:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        while self.in_flight:
            await self._next_result()
        if kind is None:  # the block's own error goes first
            self._raise_failure()

    async def wait_for_room(self) -> None:
        """Return once the window has room for one more send: a message built after this
        (stamped with the time, say) leaves as soon as `send` is called."""
        if self.in_flight >= self.window:
            while self.in_flight >= self.window:
                await self._next_result()
            self._refilling = self.window - self.in_flight

    async def send(self, message: Message, *, compress: bool = False) -> None:
        """Send `message`; its outcome goes to `on_result`. Yields only while the window is full."""
        await self.wait_for_room()
        at_once = self._refilling == 0
        if not at_once:
            self._refilling -= 1
        self._raise_failure()
        await trio.lowlevel.checkpoint_if_cancelled()
        self.in_flight += 1
        handed_on = False
        try:
            await self._store(message, compress, partial(self._stored, message), at_once)
            handed_on = True
        finally:
            if not handed_on:  # cancelled while no broker was reachable, or refused: no result comes
                self.in_flight -= 1

    def _stored(self, message: Message, error: SendError | None) -> None:
        self.in_flight -= 1
        if self._answered is not None:
            self._answered.set()
            self._answered = None
        try:
            self._on_result(message, error)
        except Exception as exc:  # raised in the sender's task, not the connection's
            self._failure = self._failure or exc

    async def _next_result(self) -> None:
        if self._answered is None:
            self._answered = trio.Event()
        await self._answered.wait()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
