"""Blocking Producer and Consumer for code that is not async: threads, Flask, scripts, asyncio.

Each object runs the async client (kiteq.Producer / kiteq.Consumer) in its own Trio
loop on a daemon thread. Calls from any number of user threads hop into that loop
with `trio.from_thread.run`, so they share one set of broker connections and their
requests are pipelined on them. From asyncio, call the blocking methods through
`asyncio.to_thread` (see docs/clients.md).

    with kiteq.sync.Producer("file://./data/registry.json", group="order-svc", topics=["trade"]) as p:
        p.send_string("trade", "pay-succ", "order 7 paid")   # raises SendError in this thread
"""

from __future__ import annotations

import atexit
import inspect
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from functools import partial
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import structlog
import trio

from kiteq.client import CheckMessageListener as AsyncCheckMessageListener
from kiteq.client import Consumer as AsyncConsumer
from kiteq.client import Message, SendResult
from kiteq.client import MessageListener as AsyncMessageListener
from kiteq.client import Producer as AsyncProducer
from kiteq.client.base import Client
from kiteq.client.options import ConsumerOptions, ProducerOptions, keyword_options
from kiteq.errors import KiteQError, leaf_error
from protocol import TxStatus

log = structlog.get_logger(__name__)

T = TypeVar("T")
C = TypeVar("C", bound=Client)


class MessageListener(ABC):
    """kiteq.MessageListener with a plain `on_message`, run in a worker thread.

    Same contract: True acks; False, raising or exceeding `message_timeout` nacks
    and the broker redelivers later. Up to `max_concurrency` run at once, each in
    its own thread, so shared state needs a lock.
    """

    @abstractmethod
    def on_message(self, message: Message) -> bool: ...


class CheckMessageListener(ABC):
    """kiteq.CheckMessageListener with a plain `check`, run in a worker thread."""

    @abstractmethod
    def check(self, message: Message) -> TxStatus: ...


Handler = MessageListener | Callable[[Message], object]
Checker = CheckMessageListener | Callable[[Message], TxStatus]


class _InThreads(AsyncMessageListener):
    """Runs a blocking handler off the Trio thread, at most `threads` at once.

    On `message_timeout` the thread is abandoned (Python cannot stop it): the
    message is nacked right away and whatever the thread returns later is ignored.
    """

    def __init__(self, handler: Handler, threads: int) -> None:
        self.handler = handler.on_message if isinstance(handler, MessageListener) else handler
        if inspect.iscoroutinefunction(self.handler):
            raise TypeError("an async listener must subclass kiteq.MessageListener (it runs in the loop)")
        self.limiter = trio.CapacityLimiter(threads)

    async def on_message(self, message: Message) -> bool:
        return bool(
            await trio.to_thread.run_sync(self.handler, message, abandon_on_cancel=True, limiter=self.limiter)
        )


class _CheckInThread(AsyncCheckMessageListener):
    def __init__(self, checker: Checker) -> None:
        self.checker = checker.check if isinstance(checker, CheckMessageListener) else checker

    async def check(self, message: Message) -> TxStatus:
        return await trio.to_thread.run_sync(self.checker, message)


def _typed(error: BaseException) -> BaseException:
    """The KiteQError inside a Trio exception group, so callers can `except AuthError`."""
    return leaf_error(error, (KiteQError,)) or error


class _LoopThread(Generic[C]):
    """One Trio loop on a daemon thread, hosting one async client for blocking callers.

    Calls are counted here, in user threads, under a lock: `close` refuses new
    calls, waits for the counted ones (a send_tx counts from store to decision),
    then leaves the client's `async with`, which drains listeners and flushes acks
    and decisions before disconnecting.
    """

    def __init__(self, make_client: Callable[[], C], name: str) -> None:
        self.name = name
        self._make_client = make_client
        self.client: C | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._inflight = 0
        self._closing = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self.client is None or self._error is not None:
            self._thread.join()
            assert self._error is not None
            raise _typed(self._error)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:
            self._error = exc
            if self.client is not None:  # failures to start are raised to the constructor's caller
                log.error("sync.client_failed", client=self.name, error=repr(_typed(exc)))
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with self._make_client() as client:
            self.client = client
            self._ready.set()
            await self._stop.wait()

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Count a caller's use of the client so `close` waits for it."""
        with self._lock:
            if self._closing:
                raise RuntimeError(f"{self.name} is closed")
            self._inflight += 1
        try:
            yield
        finally:
            with self._lock:
                self._inflight -= 1
                if not self._inflight:
                    self._drained.notify_all()

    def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run `fn()` in the loop and wait for it; its exception is raised in this thread."""
        try:
            return trio.from_thread.run(fn, trio_token=self._token)
        except trio.RunFinishedError:
            error = _typed(self._error) if self._error is not None else None
            raise RuntimeError(f"{self.name} has stopped; create a new one") from error

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        with self.busy():
            return self.run(fn)

    def close(self) -> None:
        with self._lock:
            first = not self._closing
            self._closing = True
            while self._inflight:
                self._drained.wait()
        if first and self._stop is not None:
            with suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()
        if first and self._error is not None:
            raise _typed(self._error)

    def wait(self, timeout: float | None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()


class _Blocking(Generic[C]):
    """Lifecycle shared by the blocking clients: start on construction, `close` once."""

    _loop: _LoopThread[C]

    def _start(self, make_client: Callable[[], C], name: str) -> None:
        self._loop = _LoopThread(make_client, name)
        # Scripts that forget close() still flush acks and tx decisions at exit.
        atexit.register(self.close)

    @property
    def client(self) -> C:
        """The async client running in the background loop (for introspection)."""
        assert self._loop.client is not None
        return self._loop.client

    def close(self) -> None:
        """Graceful: wait for calls in flight, drain listeners, flush acks, disconnect.

        Safe to call more than once and from any thread, except a listener's own
        thread (it would wait for itself until `drain_timeout`).
        """
        atexit.unregister(self.close)
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Producer(_Blocking[AsyncProducer]):
    """Blocking kiteq.Producer; one instance serves every thread of the process.

    Connects on construction (raises AuthError or TLSError if refused). Every method blocks
    the calling thread only, and raises what the async method raises (SendError).
    """

    @keyword_options(ProducerOptions[Checker])
    def __init__(self, registry: str, options: ProducerOptions[Checker]) -> None:
        checker = options.check_listener
        check_listener = _CheckInThread(checker) if checker is not None else None
        self._start(
            lambda: AsyncProducer(registry, **{**vars(options), "check_listener": check_listener}),
            f"kiteq-producer-{options.group}",
        )

    def send(
        self,
        message: Message,
        *,
        compress: bool = False,
        deliver_at: datetime | float | None = None,
        delay: float | None = None,
    ) -> str:
        """Store the message on a broker; its id once stored. Raises SendError.

        `compress`, `deliver_at` and `delay` as for kiteq.Producer.send.
        """
        send = partial(self.client.send, message, compress=compress, deliver_at=deliver_at, delay=delay)
        return self._loop.call(send)

    def cancel(self, message_id: str) -> None:
        """Withdraw a scheduled message of this group before its delivery; raises CancelError."""
        self._loop.call(partial(self.client.cancel, message_id))

    def send_string(
        self, topic: str, message_type: str, text: str, *, compress: bool = False, **options: Any
    ) -> str:
        """Send a StringMessage; `options` are Message fields (properties, ttl, deliver_limit, fly…)."""
        return self.send(Message(topic, message_type, text, **options), compress=compress)

    def send_bytes(
        self, topic: str, message_type: str, body: bytes, *, compress: bool = False, **options: Any
    ) -> str:
        """Send a BytesMessage; `options` as for `send_string`."""
        return self.send(Message(topic, message_type, bytes(body), **options), compress=compress)

    def send_many(self, messages: Sequence[Message], *, compress: bool = False) -> list[SendResult]:
        """Send all at once, pipelined; one SendResult per message, in order."""
        return self._loop.call(partial(self.client.send_many, messages, compress=compress))

    def send_tx(
        self, message: Message, local_tx: Callable[[Message], object], *, compress: bool = False
    ) -> TxStatus:
        """Two-phase send; `local_tx(message)` runs in *this* thread between store and decision.

        Running it here keeps thread-bound resources usable (a sqlite3 connection, a
        scoped SQLAlchemy session, Flask's request context). Truthy commits; falsy or
        raising rolls back (the exception is re-raised after the rollback is sent).
        """
        with self._loop.busy():
            connection = self._loop.run(partial(self.client._begin_tx, message, compress))
            try:
                committed = bool(local_tx(message))
            except BaseException:
                self._loop.run(
                    partial(
                        self.client._end_tx,
                        connection,
                        message,
                        committed=False,
                        feedback="local transaction raised",
                    )
                )
                raise
            return self._loop.run(partial(self.client._end_tx, connection, message, committed=committed))


class Consumer(_Blocking[AsyncConsumer]):
    """Blocking kiteq.Consumer: delivers to a plain function in worker threads.

    `listener` is a kiteq.sync.MessageListener or any callable `(Message) -> bool`,
    run in worker threads; an async kiteq.MessageListener (IdempotentListener) is
    also accepted and runs in the consumer's loop.
    Consuming starts on construction and runs in the background; `wait()` blocks
    until it stops, `close()` stops it gracefully (running listeners finish and
    their acks are sent first).
    """

    @keyword_options(ConsumerOptions[Handler | AsyncMessageListener])
    def __init__(self, registry: str, options: ConsumerOptions[Handler | AsyncMessageListener]) -> None:
        handler = options.listener
        listener = (
            handler
            if isinstance(handler, AsyncMessageListener)
            else _InThreads(handler, options.max_concurrency)
        )
        self._start(
            lambda: AsyncConsumer(registry, **{**vars(options), "listener": listener}),
            f"kiteq-consumer-{options.group}",
        )

    @property
    def acked(self) -> int:
        return self.client.acked

    @property
    def nacked(self) -> int:
        return self.client.nacked

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the consumer stops (True) or `timeout` passes (False); Ctrl-C interrupts."""
        return self._loop.wait(timeout)


__all__ = ["CheckMessageListener", "Consumer", "MessageListener", "Producer", "SendResult"]
