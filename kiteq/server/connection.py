"""One client connection on the broker: handshake, then requests and answers.

The reader decodes every frame of a read and handles each in order; the only
handling that waits (storing messages, applying a tx decision) runs as a task in
the connection's own nursery. The messages of one read are stored by one task (one
save for them all), and at most `max_inflight_per_connection` messages are being
stored at once, so a fast producer is slowed by TCP back-pressure instead of growing
our memory. Replies and deliveries go through the FramedStream outbox.

Every request this broker sends (a delivery, a tx check) is pending under this
connection's own opaque counter; answers are matched on (connection, opaque), so
two connections can never complete each other's requests (KiteQ's global table can).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import structlog
import trio

from kiteq.budget import Budget
from kiteq.errors import ProtocolError
from kiteq.server.delivery.lanes import Delivery
from kiteq.transport import FramedStream, OutboxOverflow
from protocol import MESSAGE_CMDS, Cmd, Frame, decode_body, encode_frame, encode_raw_frame, pb
from protocol.commands import TxStatus

if TYPE_CHECKING:
    from kiteq.server.broker import Broker
    from kiteq.server.tx.backscan import TxCheck

log = structlog.get_logger(__name__)

IDLE_DEADLINE_STEP = 0.1  # of idle_timeout; see BrokerConnection._still_active
# One read can hold thousands of small frames (a consumer's acks): the reader lets the
# rest of the broker run after this many, so a producer's acks are not held up behind them.
READ_BURST = 128


class Pending(Protocol):
    deadline: float

    def resolve(self, ok: bool, reason: str = "") -> None: ...


# (opaque, BYTES_MESSAGE or STRING_MESSAGE, its decoded body, that body as received)
MessageRequest = tuple[int, Cmd, "pb.BytesMessage | pb.StringMessage", bytes]


class Refused(Exception):
    """The connection must end now (failed auth, message before auth, overflow)."""


class BrokerConnection:
    def __init__(self, broker: Broker, stream: trio.abc.Stream, peer: str) -> None:
        self.broker = broker
        self.peer = peer
        self.framed = FramedStream(stream, broker.config.server.max_frame_bytes, expect_more=self._busy)
        self.group = ""
        self.authenticated = False
        self.authenticated_at = 0.0
        self.warmup_seconds = 0.0
        self.inflight = 0
        self.pending: dict[int, Pending] = {}
        self._opaques: Iterator[int] = itertools.cycle(range(1, 2**32))
        self._handling = Budget(broker.config.server.max_inflight_per_connection)
        self._nursery: trio.Nursery | None = None
        self.log = log.bind(conn=peer)

    def _busy(self) -> bool:
        """More frames are on their way: acks of messages being stored, or acks that free deliveries."""
        return self.inflight > 1 or self._handling.used > 1

    @property
    def alive(self) -> bool:
        return self.authenticated and not self.framed.closed

    # -- lifecycle --------------------------------------------------------------------

    async def serve(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.framed.write_loop)
                try:
                    await self._read()
                finally:
                    self.framed.finish()
        finally:
            self._abandon_pending()
            await trio.aclose_forcefully(self.framed.stream)

    async def _read(self) -> None:
        config = self.broker.config.server
        with trio.CancelScope(deadline=trio.current_time() + config.handshake_timeout) as scope:
            self._idle_scope = scope
            try:
                await self.framed.read_loop(self._on_frames)
            except ProtocolError as exc:
                self.log.warning("connection.protocol_error", error=str(exc))
            except (Refused, OutboxOverflow) as exc:
                self.log.info("connection.closed_by_broker", reason=str(exc))
        if scope.cancelled_caught:
            self.log.info("connection.idle_timeout", seconds=config.idle_timeout)

    def _abandon_pending(self) -> None:
        """The connection is gone: every delivery on it failed, every question is unanswered."""
        pending, self.pending = self.pending, {}
        self.inflight = 0
        for request in pending.values():
            request.resolve(False, "connection-lost")

    # -- requests we send ---------------------------------------------------------------

    def deliver(self, delivery: Delivery, timeout: float) -> None:
        opaque = next(self._opaques)
        delivery.opaque = opaque
        delivery.sent_at = time.time()
        delivery.deadline = trio.current_time() + timeout
        self.pending[opaque] = delivery
        self.inflight += 1
        self._send(encode_raw_frame(opaque, delivery.round.cmd, delivery.round.body))

    def ask(self, check: TxCheck, timeout: float) -> None:
        opaque = next(self._opaques)
        check.opaque = opaque
        check.deadline = trio.current_time() + timeout
        self.pending[opaque] = check
        packet = pb.TxACKPacket(
            header=check.entity.header(), status=TxStatus.UNKNOWN, feedback="Server Check"
        )
        self._send(encode_frame(opaque, Cmd.TX_ACK, packet))

    def expire(self, now: float) -> None:
        """Fail requests past their deadline (pending is in send order, deadlines ascend per kind)."""
        expired = [opaque for opaque, request in self.pending.items() if request.deadline <= now]
        for opaque in expired:
            self._take(opaque).resolve(False, "timeout")  # type: ignore[union-attr]

    def _take(self, opaque: int) -> Pending | None:
        request = self.pending.pop(opaque, None)
        if isinstance(request, Delivery):
            self.inflight -= 1
        return request

    def _send(self, data: bytes) -> None:
        try:
            self.framed.send(data)
        except OutboxOverflow:
            self.log.warning("connection.outbox_overflow")
            self.framed.finish()

    def reply(self, opaque: int, cmd: Cmd, message: object) -> None:
        self._send(encode_frame(opaque, cmd, message))  # type: ignore[arg-type]

    # -- frames we receive ----------------------------------------------------------------

    async def _on_frames(self, frames: list[Frame]) -> None:
        self._still_active()
        messages: list[MessageRequest] = []
        for handled, frame in enumerate(frames, 1):
            if handled % READ_BURST == 0:
                await trio.lowlevel.checkpoint()
            if not self.authenticated and frame.cmd is not Cmd.CONN_META:
                self.reply(
                    frame.opaque,
                    Cmd.CONN_AUTH_ACK,
                    pb.ConnAuthAck(status=False, feedback="Unauthorized,Connection broken!"),
                )
                raise Refused(f"{frame.cmd.name} before ConnMeta")
            try:
                body = decode_body(frame)
            except ProtocolError as exc:
                self._refuse_body(frame, exc)
                continue
            if frame.cmd in MESSAGE_CMDS:
                messages.append((frame.opaque, frame.cmd, body, frame.body))  # type: ignore[arg-type]
                continue
            if messages:
                await self._store(messages)
                messages = []
            await self._handle(frame, body)
        if messages:
            await self._store(messages)

    def _still_active(self) -> None:
        """Push the idle deadline back when it would move by a tenth of the timeout or more.

        Each move of a cancel scope's deadline queues an entry in Trio's deadline heap;
        moved on every read under load, expiring the stale ones showed in profiles. So a
        silent connection is closed between 0.9 and 1 idle_timeout after its last frame.
        """
        timeout = self.broker.config.server.idle_timeout
        deadline = trio.current_time() + timeout
        if deadline - self._idle_scope.deadline >= IDLE_DEADLINE_STEP * timeout:
            self._idle_scope.deadline = deadline

    def _refuse_body(self, frame: Frame, exc: ProtocolError) -> None:
        """A body that does not parse: answer what can be answered, keep the connection."""
        self.log.warning("connection.bad_body", cmd=frame.cmd.name, error=str(exc))
        if frame.cmd in MESSAGE_CMDS:
            self.reply(
                frame.opaque,
                Cmd.MESSAGE_STORE_ACK,
                pb.MessageStoreAck(messageId="", status=False, feedback=f"bad message: {exc}"),
            )
        elif frame.cmd is Cmd.CONN_META:
            self.reply(
                frame.opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=False, feedback=f"bad ConnMeta: {exc}")
            )
            raise Refused("undecodable ConnMeta")

    async def _store(self, messages: list[MessageRequest]) -> None:
        """Hand a read's messages to store tasks, no more per task than may be in flight at all."""
        chunk = max(1, self._handling.limit)
        for start in range(0, len(messages), chunk):
            part = messages[start : start + chunk]
            await self._spawn(len(part), self.broker.produce, self, part)

    async def _handle(self, frame: Frame, body: object) -> None:
        cmd = frame.cmd
        if cmd is Cmd.DELIVER_ACK:
            request = self._take(frame.opaque)
            if request is not None:
                request.resolve(body.status, "" if body.status else (body.feedback or "nack"))  # type: ignore[attr-defined]
        elif cmd is Cmd.TX_ACK:
            request = self._take(frame.opaque)
            if request is not None:
                request.resolve(
                    True, TxStatus(body.status).name.lower() if body.status in (0, 1, 2) else "unknown"
                )  # type: ignore[attr-defined]
            await self._spawn(1, self.broker.decide, self, body)
        elif cmd is Cmd.HEARTBEAT:
            self.reply(frame.opaque, Cmd.HEARTBEAT, pb.HeartBeat(version=body.version))  # type: ignore[attr-defined]
        elif cmd is Cmd.CONN_META:
            self._authenticate(frame.opaque, body)  # type: ignore[arg-type]
        else:
            self.log.warning("connection.unexpected_command", cmd=cmd.name)

    async def _spawn(self, weight: int, handler, *args: object) -> None:  # type: ignore[no-untyped-def]
        """Run a handler that waits (on the store) in a task, so the reader goes on reading.

        `weight` is how many requests it handles; once `max_inflight_per_connection` are
        being handled, the reader waits (and TCP slows the client down).
        """
        await self._handling.take(weight)
        assert self._nursery is not None
        self._nursery.start_soon(self._run_bounded, weight, handler, args)

    async def _run_bounded(self, weight: int, handler, args: tuple[object, ...]) -> None:  # type: ignore[no-untyped-def]
        try:
            await handler(*args)
        finally:
            self._handling.give(weight)

    def _authenticate(self, opaque: int, meta: pb.ConnMeta) -> None:
        if self.authenticated:
            self.reply(opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=True, feedback="Auth Succ"))
            return
        refusal = self.broker.check_auth(meta.groupId, meta.secretKey, self.peer)
        if refusal:
            self.reply(opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=False, feedback=refusal))
            raise Refused(refusal)
        self.group = meta.groupId
        self.warmup_seconds = float(max(0, meta.warmingupSec))
        self.authenticated_at = time.time()
        self.authenticated = True
        self.log = self.log.bind(group=self.group)
        self._idle_scope.deadline = trio.current_time() + self.broker.config.server.idle_timeout
        self.reply(opaque, Cmd.CONN_AUTH_ACK, pb.ConnAuthAck(status=True, feedback="Auth Succ"))
        self.broker.connection_authenticated(self)
        self.log.info("connection.authenticated", warmup=self.warmup_seconds)
