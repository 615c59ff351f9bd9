"""One client connection on the broker: the I/O around its `protocol.Session`.

The session decides what the peer may send and who it is; this class reads bytes
into it, writes what it answers, and runs what its events ask for. Handling that
waits (storing messages, applying a tx decision) runs as a task in the connection's
own nursery. The messages of one read are stored by one task (one save for them all),
and at most `max_inflight_per_connection` messages are being stored at once, so a fast
producer is slowed by TCP back-pressure instead of growing our memory. A lone message
on a connection with nothing else in flight is stored by the reader itself (`_store`).
Replies and deliveries go through the FramedStream outbox.

Before the peer has authenticated, the whole connection (TLS handshake included) has
`handshake_timeout` to prove itself, reads are no larger than the pre-auth frame limit,
and the broker may evict it for a newcomer (see `admission.py`).
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, cast

import structlog
import trio

from kiteq.budget import Budget
from kiteq.config import ServerConfig
from kiteq.errors import TLSError
from kiteq.server.clock import WallClock
from kiteq.server.delivery.lanes import Delivery
from kiteq.server.handlers import Handlers
from kiteq.server.refusals import RefusalLog
from kiteq.server.tx.checks import TxCheck
from kiteq.server.tx.decisions import decision_of
from kiteq.tls import accept_stream
from kiteq.transport import READ_SIZE, FramedStream, OutboxOverflow
from protocol import HEADER_SIZE, Cmd, TxStatus, pb
from protocol.session import (
    Answered,
    CancelRequested,
    Event,
    Hello,
    Ignored,
    MessageReceived,
    MessageRefused,
    Role,
    Session,
    SessionError,
    TxDecision,
    quote,
)

log = structlog.get_logger(__name__)

IDLE_DEADLINE_STEP = 0.1  # of idle_timeout; see BrokerConnection._still_active
# Deliveries waiting unsent in our buffer beyond this many bytes make the connection
# congested: it gets no more until it drains, so a slow reader holds little of ours.
CONGESTION_BYTES = 256 * 1024
# A delivery's deliver_timeout starts when it reaches the socket; until then it may wait
# this many timeouts in our buffer (a consumer that reads nothing at all still times out).
UNSENT_GRACE = 10
# A sender whose reads hold at most this many messages trickles them in (paced): the file
# store may hold its saves a moment for the next ones to share a sync (`Batch.wait`).
# Paced at 5,000 messages a second, 94 % of the messages came in reads of one to three; a
# sender keeping its window of 100 full had 99 % come in reads of 12 or more.
TRICKLE_READ = 3
# One read can hold thousands of small frames (a consumer's acks): the reader lets the
# rest of the broker run after this many, so a producer's acks are not held up behind them.
READ_BURST = 128


class Host(Protocol):
    """What a connection needs of the broker that accepted it."""

    tls: ssl.SSLContext | None
    refusals: RefusalLog
    handlers: Handlers
    clock: WallClock
    # The connections with requests of ours pending: the broker times out theirs alone.
    awaiting: set[BrokerConnection]

    def authenticate(self, connection: BrokerConnection, hello: Hello) -> str:
        """'' when the connection may act as `hello.group`, else the reason to send back."""

    def authenticated(self, connection: BrokerConnection) -> None:
        """It proved its group: it may now be delivered to and asked."""

    def drained(self, connection: BrokerConnection) -> None:
        """It was congested and its unsent deliveries went out: it may be given more."""


class Refused(Exception):
    """The connection must end now (failed auth, overflow)."""


class BrokerConnection:
    def __init__(self, host: Host, config: ServerConfig, stream: trio.SocketStream, peer: str) -> None:
        self.host = host
        self.config = config
        self.peer = peer
        self.address = peer.rpartition(":")[0]  # the client's, without the port
        self.session = Session(
            Role.BROKER, max_frame_bytes=config.max_frame_bytes, pre_auth_max_bytes=config.pre_auth_max_bytes
        )
        self._tcp = stream
        self.framed = FramedStream(
            stream,
            expect_more=self.busy,
            read_size=self.session.frame_limit + HEADER_SIZE,
            on_sent=self._deliveries_sent,
        )
        self._deliver_timeout = 0.0
        self._was_congested = False
        self.warmup_seconds = 0.0
        self.authenticated_at = 0.0
        self._handling = Budget(config.max_inflight_per_connection)
        self._nursery: trio.Nursery | None = None
        self._evicted = trio.CancelScope()
        self._idle_scope = trio.CancelScope(deadline=trio.current_time() + config.handshake_timeout)
        self.log = log.bind(conn=peer)

    @property
    def group(self) -> str:
        return self.session.group if self.authenticated else ""

    @property
    def authenticated(self) -> bool:
        return self.authenticated_at > 0

    @property
    def inflight(self) -> int:
        """Deliveries sent and not yet answered (the broker picks the least loaded connection)."""
        return self.session.inflight

    def busy(self) -> bool:
        """More frames are on their way: acks of messages being stored, or acks that free deliveries."""
        return self.session.inflight > 1 or self._handling.used > 1

    def trickling(self, messages: int) -> bool:
        """Whether a read of `messages` says its sender trickles them in (TRICKLE_READ); over
        TLS a read says nothing of what waits behind it."""
        return messages <= TRICKLE_READ and self.framed.reads_all_queued

    @property
    def alive(self) -> bool:
        return self.authenticated and not self.framed.closed

    @property
    def congested(self) -> bool:
        return self.framed.bulk_bytes >= CONGESTION_BYTES

    # -- lifecycle --------------------------------------------------------------------

    async def serve(self) -> None:
        try:
            with self._evicted, self._idle_scope:
                await self._serve()
            if self._idle_scope.cancelled_caught:
                reason = "idle" if self.authenticated else "no ConnMeta within handshake_timeout"
                self.log.info("connection.timed_out", reason=reason)
        finally:
            for request in self.session.close():
                request.resolve(False, "connection-lost")
            await trio.aclose_forcefully(self.framed.stream)

    async def _serve(self) -> None:
        try:
            self.framed.stream = await accept_stream(self._tcp, self.host.tls)
        except TLSError as exc:
            self.host.refusals.refused("connection.tls_failed", conn=self.peer, error=str(exc)[:200])
            return
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self.framed.write_loop)
            try:
                await self.framed.read_loop(self._on_data)
            except SessionError as exc:
                if exc.reply:
                    self._send(exc.reply)
                if self.authenticated:
                    self.host.refusals.refused(
                        "connection.protocol_error", conn=self.peer, group=self.group, error=str(exc)
                    )
                else:
                    self.host.refusals.refused(
                        "connection.refused_before_auth", conn=self.peer, error=str(exc)
                    )
            except (Refused, OutboxOverflow) as exc:
                self.log.info("connection.closed_by_broker", reason=str(exc))
            finally:
                self.framed.finish()

    def evict(self) -> None:
        """Close this unauthenticated connection to make room for a newcomer."""
        self.host.refusals.refused("connection.evicted", conn=self.peer, reason="room for a newer connection")
        self._evicted.cancel()

    # -- requests we send ---------------------------------------------------------------

    def deliver(self, delivery: Delivery, timeout: float) -> None:
        """Queue a delivery after the control frames; its timeout starts once it is sent."""
        round_ = delivery.round
        self._deliver_timeout = timeout
        delivery.opaque, frame = self.session.request(
            round_.cmd, round_.body, delivery, trio.current_time() + UNSENT_GRACE * timeout
        )
        delivery.sent_at = self.host.clock()
        self.host.awaiting.add(self)
        self.framed.send_bulk(frame, delivery)
        self._was_congested = self._was_congested or self.congested

    def _deliveries_sent(self, sent: list[object]) -> None:
        """Deliveries reached the socket: their deliver_timeout starts now."""
        deadline = trio.current_time() + self._deliver_timeout
        for delivery in sent:
            self.session.restart_deadline(cast(Delivery, delivery).opaque, deadline)
        if self._was_congested and not self.congested:
            self._was_congested = False
            self.host.drained(self)

    def ask(self, check: TxCheck, timeout: float) -> None:
        packet = pb.TxACKPacket(
            header=check.entity.header(), status=TxStatus.UNKNOWN, feedback="Server Check"
        )
        check.opaque, frame = self.session.request(
            Cmd.TX_ACK, packet.SerializeToString(), check, trio.current_time() + timeout
        )
        self.host.awaiting.add(self)
        self._send(frame)

    def expire(self, now: float) -> bool:
        """Fail requests past their deadline; whether any are still pending."""
        for request in self.session.expire(now):
            request.resolve(False, "timeout")
        return self.session.pending > 0

    def store_ack(self, opaque: int, message_id: str, stored: bool, feedback: str) -> None:
        self._send(self.session.store_ack(opaque, message_id, stored, feedback))

    def _send(self, data: bytes) -> None:
        try:
            self.framed.send(data)
        except OutboxOverflow:
            self.log.warning("connection.outbox_overflow")
            self.framed.finish()

    def _send_outgoing(self) -> None:
        """What the session answered by itself: heartbeat echoes, auth acks, refusals."""
        outgoing = self.session.outgoing
        if outgoing:
            for data in outgoing:
                self._send(data)
            outgoing.clear()

    # -- what we receive ----------------------------------------------------------------

    async def _on_data(self, data: bytes | bytearray) -> None:
        self._still_active()
        events = self.session.receive_data(data)
        self._send_outgoing()
        if events:
            await self._handle(events)
        self.session.check()

    async def _handle(self, events: Sequence[Event]) -> None:
        messages: list[MessageReceived] = []
        for handled, event in enumerate(events, 1):
            if handled % READ_BURST == 0:
                await trio.lowlevel.checkpoint()
            if isinstance(event, MessageReceived):
                messages.append(event)
                continue
            if messages:  # stored before what follows them (a commit of one of them, say)
                await self._store(messages)
                messages = []
            if isinstance(event, Answered):
                answer = event.answer
                event.request.resolve(answer.status, "" if answer.status else (answer.feedback or "nack"))
            elif isinstance(event, TxDecision):
                await self._on_decision(event)
            elif isinstance(event, CancelRequested):
                await self._spawn(1, self.host.handlers.cancel, self, event)
            elif isinstance(event, Hello):
                await self._authenticate(event)
            elif isinstance(event, MessageRefused):
                self.host.refusals.refused(
                    "message.wrong_group", conn=self.peer, group=self.group, reason=event.reason
                )
            elif isinstance(event, Ignored):
                self.host.refusals.refused(
                    "connection.ignored_frame", conn=self.peer, cmd=event.cmd.name, reason=event.reason[:200]
                )
        if messages:
            await self._store(messages)

    async def _on_decision(self, decision: TxDecision) -> None:
        if decision.question is not None:
            decision.question.resolve(True, decision_of(decision.status).name.lower())
        await self._spawn(1, self.host.handlers.decide, self, decision)

    async def _authenticate(self, hello: Hello) -> None:
        refusal = self.host.authenticate(self, hello)
        if refusal:
            self._send(self.session.refuse(refusal))
            raise Refused(f"authentication refused for group {quote(hello.group)}")
        held = self.session.accept()
        self.warmup_seconds = float(hello.warmup_seconds)
        self.authenticated_at = self.host.clock()
        self.framed.read_size = READ_SIZE
        self.log = self.log.bind(group=self.group)
        self._idle_scope.deadline = trio.current_time() + self.config.idle_timeout
        self._send_outgoing()
        self.host.authenticated(self)
        self.log.info("connection.authenticated", warmup=self.warmup_seconds)
        if held:
            await self._handle(held)

    def _still_active(self) -> None:
        """Push the idle deadline back when it would move by a tenth of the timeout or more.

        Each move of a cancel scope's deadline queues an entry in Trio's deadline heap;
        moved on every read under load, expiring the stale ones showed in profiles. So a
        silent connection is closed between 0.9 and 1 idle_timeout after its last frame.
        Until it authenticated, only the handshake deadline counts.
        """
        if not self.authenticated:
            return
        timeout = self.config.idle_timeout
        deadline = trio.current_time() + timeout
        if deadline - self._idle_scope.deadline >= IDLE_DEADLINE_STEP * timeout:
            self._idle_scope.deadline = deadline

    async def _store(self, messages: list[MessageReceived]) -> None:
        """Hand a read's messages to store tasks, no more per task than may be in flight at all.

        A lone message on a connection with nothing else being handled (a producer awaiting each
        store-ack) is stored by the reader itself: a task of its own would cost a turn of the
        event loop, which its store-ack would wait for. A store that must wait (the disk busy)
        then holds up only this connection's next reads. Not over TLS: a read there holds only
        the records Trio has pulled from the socket, so a message read alone says little of what
        waits behind it, and a producer keeping sends in flight had each wait for the sync of
        the one before (paced at 1,000/s on the file store, p50 13.7-17.5 ms against 2.0 once
        its messages went the way of any other read). Otherwise, on a store that stages without
        waiting (`stages_at_once`), the reader stages them and hands them to their groups
        itself, and only their wait for the sync and their store-acks go to a task: a task of
        its own delivered them a turn later, and at 5,000 messages a second on two cores that
        turn was a good part of a message's way (p50 about 40 % lower with it saved and the
        pump's turn too, `Lane.take_slot_now`).
        """
        handlers = self.host.handlers
        if len(messages) == 1 and not self._handling.used and self.framed.reads_all_queued:
            await self._handling.take()
            await self._run_bounded(1, handlers.produce, (self, messages))
            return
        chunk = max(1, self._handling.limit)
        for start in range(0, len(messages), chunk):
            part = messages[start : start + chunk]
            if not handlers.stages_at_once:
                await self._spawn(len(part), handlers.produce, self, part)
                continue
            await self._handling.take(len(part))
            staged = await handlers.stage(self, part)
            if staged is None:
                self._handling.give(len(part))
                continue
            self._start(len(part), handlers.acknowledge, (self, staged))

    async def _spawn(self, weight: int, handler: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run a handler that waits (on the store) in a task, so the reader goes on reading.

        `weight` is how many requests it handles; once `max_inflight_per_connection` are
        being handled, the reader waits (and TCP slows the client down).
        """
        await self._handling.take(weight)
        self._start(weight, handler, args)

    def _start(self, weight: int, handler: Callable[..., Awaitable[None]], args: tuple[Any, ...]) -> None:
        """Run `handler(*args)` in a task of its own, `weight` of the handling bound taken already."""
        assert self._nursery is not None
        self._nursery.start_soon(self._run_bounded, weight, handler, args)

    async def _run_bounded(
        self, weight: int, handler: Callable[..., Awaitable[None]], args: tuple[Any, ...]
    ) -> None:
        try:
            await handler(*args)
        finally:
            self._handling.give(weight)
