"""Producer: sends messages (plain or transactional) and answers transaction checks."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
import trio

from kiteq.client.base import Client
from kiteq.client.connection import ClientConnection
from kiteq.client.listeners import CheckMessageListener
from kiteq.client.message import Message
from kiteq.client.options import ProducerOptions, keyword_options
from kiteq.client.pipeline import OnResult, SendPipeline
from kiteq.errors import CancelError, ConnectionClosed, SendError
from kiteq.registry import Registry
from protocol import MESSAGE_CMDS, Cmd, Frame, TxStatus, pb
from protocol.logevents import LogEvent
from protocol.schedule import UNKNOWN_MESSAGE
from protocol.wire import WireAck

log = structlog.get_logger(__name__)

LocalTx = Callable[[Message], Awaitable[object]]


@dataclass(frozen=True)
class SendResult:
    """What `send_many` reports per message: the id, and the error if it was not stored."""

    message_id: str
    error: SendError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def schedule(message: Message, deliver_at: datetime | float | None, delay: float | None) -> None:
    """Set `message`'s delivery time from `send`'s `deliver_at` or `delay` (not both)."""
    if deliver_at is not None and delay is not None:
        raise ValueError("pass deliver_at or delay, not both")
    if isinstance(deliver_at, datetime):
        if deliver_at.tzinfo is None:
            raise ValueError("deliver_at must be timezone-aware (a naive datetime has no single moment)")
        deliver_at = deliver_at.timestamp()
    if delay is not None:
        deliver_at = time.time() + delay
    if deliver_at is not None:
        message.schedule(deliver_at)


class Producer(Client):
    """Sends messages to the brokers serving their topics.

    `async with Producer(registry, group=..., secret=..., topics=[...])` connects to
    every broker serving those topics (found through the registry) and keeps the
    connections up. `send` returns once a broker stored the message and raises
    SendError otherwise; resending with the same message id is always safe.
    `tls=` (an ssl.SSLContext, or the path of the CA file that signs the brokers'
    certificates) connects over TLS; a broker it does not trust raises TLSError.
    """

    role = "producer"

    options: ProducerOptions[CheckMessageListener]

    @keyword_options(ProducerOptions[CheckMessageListener])
    def __init__(self, registry: str | Registry, options: ProducerOptions[CheckMessageListener]) -> None:
        super().__init__(registry, options, options.topics)
        self._warned_no_listener = False

    async def _started(self) -> None:
        await self.registry.register_producer(self.address, self.group, self.topics)

    # -- sending --------------------------------------------------------------------------

    async def send(
        self,
        message: Message,
        *,
        compress: bool = False,
        deliver_at: datetime | float | None = None,
        delay: float | None = None,
    ) -> str:
        """Store the message on a broker; its id once stored. Raises SendError.

        `compress=True` sends the body snappy-compressed (`header.snappy`), as KiteQ's Go
        client does; consumers, ours and Go's, decompress it. `deliver_at` (a datetime, or
        Unix seconds) or `delay` (seconds from now) asks the broker to deliver it no earlier
        than then: it is stored and acked at once, and `cancel` can still withdraw it (sets
        the message's kiteq.deliverAt property).
        """
        schedule(message, deliver_at, delay)
        await self._store(message, compress)
        return message.message_id

    async def cancel(self, message_id: str) -> None:
        """Withdraw a scheduled message of this group before its delivery; raises CancelError.

        Asks each broker serving this producer's topics (the one holding the message
        answers); a message already being delivered, delivered, or not scheduled is not
        cancelled, and the error says which.
        """
        # Only the id and the group matter to the broker; the rest is what proto2 requires.
        header = pb.Header(
            messageId=message_id,
            topic="",
            messageType="",
            expiredTime=-1,
            deliverLimit=0,
            groupId=self.group,
            commit=True,
            fly=False,
        )
        packet = pb.TxACKPacket(header=header, status=TxStatus.ROLLBACK, feedback="cancel")
        reasons = []
        for connection in self.pool.live():
            try:
                answer = await connection.request(
                    Cmd.CANCEL, packet.SerializeToString(), self.options.send_timeout
                )
            except (trio.TooSlowError, ConnectionClosed) as exc:
                reasons.append(f"{connection.address}: {exc or 'no answer'}")
                continue
            assert isinstance(answer, WireAck)
            if answer.status:
                return
            if not answer.feedback.startswith(UNKNOWN_MESSAGE):
                raise CancelError(
                    f"message {message_id} was not cancelled: {answer.feedback}", message_id=message_id
                )
            reasons.append(f"{connection.address}: {answer.feedback}")
        raise CancelError(
            f"message {message_id} was not cancelled: " + ("; ".join(reasons) or "no broker is reachable"),
            message_id=message_id,
        )

    def pipeline(self, on_result: OnResult, *, window: int = 100) -> SendPipeline:
        """Keep up to `window` sends in flight from one task; each outcome goes to
        `on_result(message, error)` (see SendPipeline). Costs less CPU per message than as
        many tasks each awaiting `send`."""
        return SendPipeline(self._store_nowait, on_result, window)

    async def _store(self, message: Message, compress: bool) -> ClientConnection:
        message.group = self.group
        connection = await self.pool.connection_for(message.topic, self.options.send_timeout)
        timed_out = False
        try:
            ack = await connection.request(message.cmd, message.encode(compress), self.options.send_timeout)
        except trio.TooSlowError:
            ack, timed_out = None, True
        except ConnectionClosed:
            ack = None
        error = self._outcome(connection, message, ack, timed_out)
        if error is not None:
            raise error
        return connection

    async def _store_nowait(
        self, message: Message, compress: bool, on_stored: Callable[[SendError | None], None], at_once: bool
    ) -> None:
        """`_store` for a pipeline: returns once the message is on its way; `on_stored` gets
        the outcome, once. `at_once=False` leaves it for the connection's writer (see
        `ClientConnection.request_nowait`)."""
        message.group = self.group
        try:
            connection = await self.pool.connection_for(message.topic, self.options.send_timeout)
        except SendError as exc:
            on_stored(exc)
            return

        def answered(ack: object | None, timed_out: bool) -> None:
            on_stored(self._outcome(connection, message, ack, timed_out))

        try:
            connection.request_nowait(
                message.cmd, message.encode(compress), self.options.send_timeout, answered, at_once
            )
        except ConnectionClosed:
            answered(None, False)

    def _outcome(
        self, connection: ClientConnection, message: Message, ack: object | None, timed_out: bool
    ) -> SendError | None:
        """What became of a send, logged: None once stored, else the error to report (an
        `ack` of None: no answer within the timeout, or the connection closed first)."""
        if ack is None:
            self._log(LogEvent.SEND_FAILED, message, reason="timeout" if timed_out else "connection-lost")
            if timed_out:
                return SendError(
                    f"no store ack from {connection.address} within {self.options.send_timeout} s; the "
                    "message may or may not be stored: resend it with the same id",
                    message_id=message.message_id,
                )
            return SendError(
                f"connection to {connection.address} closed before it answered; resend the message",
                message_id=message.message_id,
            )
        assert isinstance(ack, WireAck)
        if not ack.status:
            self._log(LogEvent.SEND_FAILED, message, reason=ack.feedback)
            return SendError(
                f"broker {connection.address} refused message {message.message_id}: {ack.feedback}",
                message_id=message.message_id,
            )
        self._log(LogEvent.SENT, message, broker=connection.address)
        return None

    async def send_string(
        self, topic: str, message_type: str, text: str, *, compress: bool = False, **options: Any
    ) -> str:
        """Send a StringMessage; `options` are Message fields (properties, ttl, deliver_limit, fly…)."""
        return await self.send(Message(topic, message_type, text, **options), compress=compress)

    async def send_bytes(
        self, topic: str, message_type: str, body: bytes, *, compress: bool = False, **options: Any
    ) -> str:
        """Send a BytesMessage; `options` as for `send_string`."""
        return await self.send(Message(topic, message_type, bytes(body), **options), compress=compress)

    async def send_many(self, messages: Sequence[Message], *, compress: bool = False) -> list[SendResult]:
        """Send all at once, pipelined (many requests in flight); one result per message, in order."""
        results: list[SendResult | None] = [None] * len(messages)

        async def send_one(index: int, message: Message) -> None:
            try:
                await self._store(message, compress)
                results[index] = SendResult(message.message_id)
            except SendError as exc:
                results[index] = SendResult(message.message_id, exc)

        async with trio.open_nursery() as nursery:
            for index, message in enumerate(messages):
                nursery.start_soon(send_one, index, message)
        return [r for r in results if r is not None]

    async def send_tx(self, message: Message, local_tx: LocalTx, *, compress: bool = False) -> TxStatus:
        """Two-phase send: store uncommitted, run `local_tx`, then commit or roll back.

        `local_tx(message)` returning truthy commits; falsy or raising rolls back (the
        exception is re-raised after the rollback is sent). If the decision cannot be
        sent (the broker went away), the broker asks this group's CheckMessageListener
        later; the returned status is the decision taken.
        """
        connection = await self._begin_tx(message, compress)
        try:
            committed = bool(await local_tx(message))
        except BaseException:
            await self._end_tx(connection, message, committed=False, feedback="local transaction raised")
            raise
        return await self._end_tx(connection, message, committed=committed)

    async def _begin_tx(self, message: Message, compress: bool) -> ClientConnection:
        """Store the message uncommitted (send_tx's first half; kiteq.sync runs local_tx between)."""
        message.commit = False
        return await self._store(message, compress)

    async def _end_tx(
        self, connection: ClientConnection, message: Message, *, committed: bool, feedback: str = ""
    ) -> TxStatus:
        """Send the decision (send_tx's second half); the status decided."""
        status = TxStatus.COMMIT if committed else TxStatus.ROLLBACK
        feedback = feedback or "local transaction " + ("committed" if committed else "rolled back")
        await self._decide(connection, message, status, feedback)
        return status

    async def _decide(
        self, connection: ClientConnection, message: Message, status: TxStatus, feedback: str
    ) -> None:
        header = message.header()
        packet = pb.TxACKPacket(header=header, status=status, feedback=feedback)
        live = (
            connection
            if connection.alive
            else await self.pool.connection_to(connection.address, self.options.send_timeout)
        )
        try:
            if live is None:
                raise ConnectionClosed(f"broker {connection.address} is unreachable")
            live.send(0, Cmd.TX_ACK, packet.SerializeToString())
        except ConnectionClosed as exc:
            log.warning(
                "producer.decision_not_sent",
                message_id=message.message_id,
                decision=status.name,
                error=str(exc),
                detail="the broker's back-scan will ask the CheckMessageListener",
            )

    # -- the broker's questions -------------------------------------------------------------

    async def _on_request(self, connection: ClientConnection, frame: Frame, body: object) -> None:
        if frame.cmd in MESSAGE_CMDS:
            # The broker delivers a group's messages on any connection of that group.
            log.warning(
                "producer.got_delivery",
                group=self.group,
                detail="a Consumer uses this group too; give the Producer its own group, or "
                "deliveries sent here wait for the broker's deliver timeout and come back later",
            )
            return
        if frame.cmd is not Cmd.TX_ACK:
            log.warning("producer.unexpected_request", cmd=frame.cmd.name)
            return
        assert isinstance(body, pb.TxACKPacket)
        self.nursery.start_soon(self._answer_check, connection, frame.opaque, body)

    async def _answer_check(self, connection: ClientConnection, opaque: int, packet: pb.TxACKPacket) -> None:
        message = Message.from_header(packet.header, b"")
        status, feedback = TxStatus.UNKNOWN, "no CheckMessageListener"
        if self.options.check_listener is None:
            if not self._warned_no_listener:
                self._warned_no_listener = True
                log.warning(
                    "producer.no_check_listener",
                    group=self.group,
                    detail="answering UNKNOWN to transaction checks; pass check_listener=",
                )
        else:
            try:
                status = TxStatus(await self.options.check_listener.check(message))
                feedback = "checked"
            except Exception as exc:
                status, feedback = TxStatus.UNKNOWN, f"check failed: {exc}"
                log.warning("producer.check_failed", message_id=message.message_id, error=str(exc))
        try:
            answer = pb.TxACKPacket(header=packet.header, status=status, feedback=feedback)
            connection.send(opaque, Cmd.TX_ACK, answer.SerializeToString())
        except ConnectionClosed:
            return

    def _log(self, event: LogEvent, message: Message, **fields: object) -> None:
        if self.delivery_log is not None:
            self.delivery_log.emit(
                event,
                None,
                message_id=message.message_id,
                topic=message.topic,
                message_type=message.message_type,
                producer_group=self.group,
                **fields,
            )
