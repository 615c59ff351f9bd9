"""One client connection to one broker: the I/O around its `protocol.Session`.

The session matches answers to the requests this client sent (by opaque, in this
connection's own table) and says what the broker asks. Requests the broker sends
(deliveries, transaction checks) go to `on_request`, which the Producer or Consumer
supplies; it runs in the reader and may wait (that is the consumer's back-pressure),
answering through `send`.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
import trio

from kiteq.errors import AuthError, ConnectionClosed, ProtocolError
from kiteq.tls import open_stream
from kiteq.transport import FramedStream
from protocol import Cmd, Frame, pb
from protocol.framing import DEFAULT_MAX_BODY
from protocol.session import Answered, Ignored, Request, Role, Session

log = structlog.get_logger(__name__)

HEARTBEAT_INTERVAL = 10.0
HEARTBEAT_TIMEOUT = 5.0
HEARTBEAT_MISSES = 3
CONNECT_TIMEOUT = 5.0
EXPIRY_TICK = 0.05
# Deliveries are read 32 KiB (~30 messages of 1 KiB) at a time, not the broker's
# 256 KiB: a consumer that takes a whole burst of deliveries in one read runs every
# listener of it before any ack goes back, so broker and consumer take turns instead
# of working at once (end to end, 2 cores: about 150% busy instead of 135%).
READ_SIZE = 32 * 1024
# A read of store-acks wakes at most this many waiting senders before the reader lets them
# run (and the writer send what they queued) and goes on with the rest. Woken all at once,
# a whole window of senders serializes its next messages before any leaves, and the
# broker gets them in one block while this client idles: the two take turns instead of
# overlapping (100 sends in flight, 2 cores: 1.0 core busy and about 10.5k msgs/s; in
# bursts of 12, 1.45 cores and about 15k msgs/s; bursts of 4 cost more than they gain).
ANSWER_BURST = 12

RequestHandler = Callable[["ClientConnection", Frame, object], Awaitable[None]]


@dataclass
class Credentials:
    group: str
    secret: str
    warmup_seconds: int = 0


class _Waiter:
    """One request's wait for its answer: the requesting task is parked and woken directly.

    A trio.Event per request (and the parking lot inside it) showed in a busy producer's
    profile; a request has exactly one waiter, so rescheduling that task is enough.
    """

    __slots__ = ("done", "response", "task", "timed_out")

    def __init__(self) -> None:
        self.task = trio.lowlevel.current_task()
        self.done = False
        self.response: object | None = None
        self.timed_out = False

    def finish(self, response: object | None = None, *, timed_out: bool = False) -> bool:
        """Wake the requester (once): with the answer, a timeout, or None for a closed connection.

        False if it was woken before (or gave up waiting)."""
        if self.done:
            return False
        self.done = True
        self.response = response
        self.timed_out = timed_out
        trio.lowlevel.reschedule(self.task)
        return True

    async def wait(self) -> None:
        def abort(_: object) -> trio.lowlevel.Abort:
            self.done = True
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


class _Callback:
    """One request's answer handed to a function instead of a waiting task (`request_nowait`)."""

    __slots__ = ("done", "on_answer")

    def __init__(self, on_answer: Callable[[object | None, bool], None]) -> None:
        self.on_answer = on_answer
        self.done = False

    def finish(self, response: object | None = None, *, timed_out: bool = False) -> bool:
        """Hand over the answer, a timeout, or None for a closed connection (once). False:
        no task was woken, so none is about to send again."""
        if not self.done:
            self.done = True
            self.on_answer(response, timed_out)
        return False


class ClientConnection:
    def __init__(
        self,
        address: str,
        credentials: Credentials,
        on_request: RequestHandler | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        answers_due: Callable[[], int] = lambda: 0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        self.tls = tls
        self.credentials = credentials
        self.on_request = on_request
        self.answers_due = answers_due
        self.session = Session(Role.CLIENT, max_frame_bytes=max_body)
        self.framed: FramedStream | None = None
        # Requesters woken by an answer that have not run yet: each may send again.
        self._answered_waiting = 0
        self._flushed = trio.Event()
        # Set by every request: the expiry task sleeps on it while none is pending.
        self._requested = trio.Event()
        self.log = log.bind(broker=address, group=credentials.group)

    def _busy(self) -> bool:
        """More frames are on their way now: requesters an answer woke that have not run yet
        (each may send again), or our answers to the broker's requests.

        Requests merely in flight do not count. They did, and a producer keeping sends in
        flight (`Producer.pipeline`) then sent each through the writer task, a turn of the
        event loop later; paced at 5,000 a second, that turn was about a fifth of a message's
        p50 (docs/performance-history.md, "A client's sends written at once").
        """
        return self._answered_waiting > 0 or self.answers_due() > 1

    @property
    def alive(self) -> bool:
        return self.framed is not None and not self.framed.closed

    async def run(self, *, task_status: trio.TaskStatus[ClientConnection] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, authenticate, then serve until the connection ends.

        `task_status.started(self)` fires once authenticated. Raises AuthError if the
        broker refuses us, TLSError if its certificate is not trusted, OSError if it
        cannot be reached, ConnectionClosed if it hangs up during the handshake;
        returns when it hangs up later.
        """
        host, _, port = self.address.rpartition(":")
        with trio.fail_after(CONNECT_TIMEOUT):
            stream = await open_stream(host, int(port), self.tls)
        self.framed = FramedStream(stream, expect_more=self._busy, read_size=READ_SIZE)
        authenticated = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write)
                nursery.start_soon(self._read_then_stop, nursery.cancel_scope)
                nursery.start_soon(self._expire_requests)
                await self._handshake()
                task_status.started(self)
                authenticated = True
                await self._heartbeat()
                nursery.cancel_scope.cancel()
            if not authenticated:  # the reader saw EOF and cancelled the handshake
                raise ConnectionClosed(f"broker {self.address} hung up during the handshake")
        finally:
            self.framed.finish()
            self._flushed.set()
            for waiter in self.session.close():
                waiter.finish()
            await trio.aclose_forcefully(stream)

    async def _write(self) -> None:
        assert self.framed is not None
        await self.framed.write_loop()
        self._flushed.set()

    async def close(self, timeout: float) -> None:
        """Send what is queued (acks, tx decisions), then stop; gives up after `timeout`.

        Cancelling the connection's tasks right away would drop frames still in the
        outbox: acks the broker would then count as lost and redeliver.
        """
        if self.framed is None:
            return
        self.framed.finish()
        with trio.move_on_after(timeout):
            await self._flushed.wait()

    async def _read_then_stop(self, scope: trio.CancelScope) -> None:
        assert self.framed is not None
        try:
            await self.framed.read_loop(self._on_data)
        except ProtocolError as exc:
            self.log.warning("client.protocol_error", error=str(exc))
        self.framed.finish()
        scope.cancel()

    async def _handshake(self) -> None:
        assert self.framed is not None
        credentials = self.credentials
        waiter = _Waiter()
        self.framed.send(
            self.session.connect(
                credentials.group,
                credentials.secret,
                credentials.warmup_seconds,
                waiter,
                trio.current_time() + CONNECT_TIMEOUT,
            )
        )
        self._requested.set()
        ack = await self._answer_of(waiter, CONNECT_TIMEOUT)
        assert isinstance(ack, pb.ConnAuthAck)
        if not ack.status:
            raise AuthError(f"broker {self.address} refused group {credentials.group!r}: {ack.feedback}")

    async def _heartbeat(self) -> None:
        misses = 0
        while self.alive:
            await trio.sleep(HEARTBEAT_INTERVAL)
            try:
                await self.request(
                    Cmd.HEARTBEAT,
                    pb.HeartBeat(version=int(time.time())).SerializeToString(),
                    HEARTBEAT_TIMEOUT,
                )
                misses = 0
            except (trio.TooSlowError, ConnectionClosed):
                misses += 1
                if misses >= HEARTBEAT_MISSES:
                    self.log.warning("client.heartbeat_lost", misses=misses)
                    return

    async def request(self, cmd: Cmd, body: bytes, timeout: float) -> object:
        """Send `body` (serialized) and wait for the answer with the same opaque; TooSlowError
        after `timeout`."""
        if self.framed is None or not self.alive:
            raise ConnectionClosed(f"connection to {self.address} is closed")
        waiter = _Waiter()
        opaque, data = self.session.request(cmd, body, waiter, trio.current_time() + timeout)
        self._requested.set()
        try:
            self.framed.send(data)
            return await self._answer_of(waiter, timeout)
        finally:
            self.session.forget(opaque)

    def request_nowait(
        self,
        cmd: Cmd,
        body: bytes,
        timeout: float,
        on_answer: Callable[[object | None, bool], None],
        at_once: bool = True,
    ) -> None:
        """Send a request without waiting: `on_answer(answer, timed_out)` gets its answer, or
        None if none came within `timeout` (`timed_out`) or the connection closed first.

        It is called from this connection's tasks, so it must not block. A request that
        waits in a task of its own costs that task two turns of the event loop; a sender
        keeping many requests in flight from one task (`Producer.pipeline`) pays neither.
        `at_once=False`: the request waits for the connection's writer, to go out in one
        write with the others the caller sends before yielding.
        """
        if self.framed is None or not self.alive:
            raise ConnectionClosed(f"connection to {self.address} is closed")
        opaque, data = self.session.request(cmd, body, _Callback(on_answer), trio.current_time() + timeout)
        self._requested.set()
        try:
            self.framed.send(data, at_once)
        except BaseException:
            self.session.forget(opaque)  # raised instead: never answered as well
            raise

    async def _answer_of(self, waiter: _Waiter, timeout: float) -> object:
        await waiter.wait()
        if waiter.response is not None:
            self._answered_waiting -= 1
        if waiter.timed_out:
            raise trio.TooSlowError(f"no answer from {self.address} within {timeout:g} s")
        if waiter.response is None:
            raise ConnectionClosed(f"connection to {self.address} closed before it answered")
        return waiter.response

    async def _expire_requests(self) -> None:
        """Time out unanswered requests: one task per connection, not a cancel scope per request.

        It ticks only while requests are pending. Ticking on an idle connection cost a wake-up
        every EXPIRY_TICK: 2,000 connections held open by one process kept its core busy.
        """
        while True:
            if not self.session.pending:
                await self._requested.wait()
                self._requested = trio.Event()
            await trio.sleep(EXPIRY_TICK)
            for waiter in self.session.expire(trio.current_time()):
                waiter.finish(timed_out=True)

    def send(self, opaque: int, cmd: Cmd, body: bytes) -> None:
        """Send `body` (serialized) without waiting for an answer (acks, tx decisions and answers)."""
        if self.framed is None or self.framed.closed:
            raise ConnectionClosed(f"connection to {self.address} is closed")
        self.framed.send(self.session.send(opaque, cmd, body))

    async def _on_data(self, data: bytes | bytearray) -> None:
        answered = 0
        for event in self.session.receive_data(data):
            if type(event) is Answered:
                if event.request.finish(event.answer):
                    self._answered_waiting += 1
                answered += 1
                if answered % ANSWER_BURST == 0:
                    await trio.lowlevel.checkpoint()
            elif type(event) is Request:
                if self.on_request is not None:
                    await self.on_request(self, event.frame, event.body)
            elif type(event) is Ignored:
                self.log.warning("client.ignored_frame", cmd=event.cmd.name, reason=event.reason)
        self.session.check()
