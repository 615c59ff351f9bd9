"""Consumer: binds a group to topics and hands deliveries to a MessageListener."""

from __future__ import annotations

from collections import defaultdict, deque

import structlog
import trio

from kiteq.budget import Budget
from kiteq.client.base import Client
from kiteq.client.compression import CorruptBody, decompress
from kiteq.client.connection import ClientConnection
from kiteq.client.listeners import MessageListener
from kiteq.client.message import Message
from kiteq.client.options import ConsumerOptions, keyword_options
from kiteq.errors import ConnectionClosed
from kiteq.registry import Binding, Registry
from protocol import MESSAGE_CMDS, Cmd, Frame
from protocol.logevents import LogEvent
from protocol.wire import WireMessage, encode_deliver_ack

log = structlog.get_logger(__name__)

# A worker that keeps finding deliveries queued checkpoints after this many, so a burst
# of listeners that never wait still lets the reader and the rest of the client run.
WORKER_BURST = 64

QueuedDelivery = tuple[ClientConnection, int, object]  # (connection, opaque, decoded body)


class Consumer(Client):
    """Receives the messages its bindings select and acks what its listener accepts.

    Listeners run concurrently, up to `max_concurrency` at once; past that the
    consumer stops reading, and TCP back-pressure holds the broker's deliveries
    (the broker's watermark already bounds them). Deliveries go to a pool of worker
    tasks that grows up to `max_concurrency` and stays parked when idle: a task spawned
    per delivery showed as a tenth of a busy consumer's CPU. One worker is woken at a
    time (`_wake_worker`); a worker that takes a delivery with more queued behind it
    wakes the next, so a listener that waits never holds up the rest, and a read of
    many deliveries whose listeners do not wait costs two task steps, not one per
    delivery. A listener that exceeds
    `message_timeout` is abandoned and the message nacked. On exit the consumer
    stops taking deliveries, lets running listeners finish and sends their acks,
    then closes (`drain_timeout` bounds the wait). `tls=` as for Producer.
    """

    role = "consumer"

    options: ConsumerOptions[MessageListener]

    @keyword_options(ConsumerOptions[MessageListener])
    def __init__(self, registry: str | Registry, options: ConsumerOptions[MessageListener]) -> None:
        self.bindings = [b.with_group(options.group) for b in options.bindings]
        super().__init__(registry, options, [b.topic for b in self.bindings], options.warmup_seconds)
        self._listening = Budget(options.max_concurrency)
        self._queue: deque[QueuedDelivery] = deque()
        self._idle_workers = trio.lowlevel.ParkingLot()
        self._workers = 0
        self._waking = False  # a worker was woken (or spawned) and has not taken a delivery yet
        self._stopping_flag = False
        self.acked = 0
        self.nacked = 0

    async def _started(self) -> None:
        by_topic: dict[str, list[Binding]] = defaultdict(list)
        for binding in self.bindings:
            by_topic[binding.topic].append(binding)
        for topic, bindings in by_topic.items():
            await self.registry.put_bindings(self.group, topic, bindings)

    async def _stopping(self) -> None:
        self._stopping_flag = True
        with trio.move_on_after(self.options.drain_timeout):
            await self._listening.wait_empty()

    def _answers_due(self) -> int:
        return self._listening.used

    async def _on_request(self, connection: ClientConnection, frame: Frame, body: object) -> None:
        if frame.cmd not in MESSAGE_CMDS:
            log.warning("consumer.unexpected_request", cmd=frame.cmd.name)
            return
        if self._stopping_flag:
            return  # not acked: the broker redelivers it (to another consumer) after its timeout
        await self._listening.take()
        if self._stopping_flag:  # stop began while this delivery waited for a slot
            self._listening.give()
            return
        self._queue.append((connection, frame.opaque, body))
        self._wake_worker()

    def _wake_worker(self) -> None:
        """Have a worker look at the queue, unless one woken for it has not run yet.

        One at a time: a worker that takes a delivery with more queued wakes the next
        (`_work`). Woken one per delivery, most would find the queue already empty.
        """
        if self._waking:
            return
        if self._idle_workers:
            self._idle_workers.unpark()
        elif self._workers < self._listening.limit:
            self._workers += 1
            self.nursery.start_soon(self._work)
        else:
            return  # every worker is busy, and each looks at the queue again before it parks
        self._waking = True

    async def _work(self) -> None:
        """Process queued deliveries; park when there are none (cancelled with the nursery)."""
        while True:
            self._waking = False
            for _ in range(WORKER_BURST):
                if not self._queue:
                    break
                delivery = self._queue.popleft()
                if self._queue:
                    self._wake_worker()  # in case this listener waits: the next one need not
                await self._process(*delivery)
            if self._queue:
                await trio.lowlevel.checkpoint()
            else:
                await self._idle_workers.park()

    async def _process(self, connection: ClientConnection, opaque: int, wire: object) -> None:
        assert isinstance(wire, WireMessage)
        message = Message.from_wire(wire)
        if message.snappy:
            _decompress(message)
        self._log(LogEvent.RECEIVED, message)
        ok, feedback = False, ""
        try:
            listener, timeout = self.options.listener, self.options.message_timeout
            if timeout is None:
                ok = bool(await listener.on_message(message))
            else:
                with trio.move_on_after(timeout) as scope:
                    ok = bool(await listener.on_message(message))
                if scope.cancelled_caught:
                    feedback = f"listener exceeded {timeout} s"
        except Exception as exc:
            feedback = f"listener raised {type(exc).__name__}: {exc}"
            log.warning("consumer.listener_failed", message_id=message.message_id, error=feedback)
        try:
            connection.send(
                opaque,
                Cmd.DELIVER_ACK,
                encode_deliver_ack(
                    message.message_id,
                    message.topic,
                    message.message_type,
                    message.group,
                    ok,
                    feedback or ("ok" if ok else "listener returned False"),
                ),
            )
            if ok:
                self.acked += 1
                self._log(LogEvent.PROCESSED, message)
            else:
                self.nacked += 1
        except ConnectionClosed:
            log.info("consumer.ack_lost", message_id=message.message_id, detail="the broker will redeliver")
        finally:
            self._listening.give()

    def _log(self, event: LogEvent, message: Message) -> None:
        if self.delivery_log is not None:
            self.delivery_log.emit(
                event,
                None,
                message_id=message.message_id,
                topic=message.topic,
                message_type=message.message_type,
                producer_group=message.group,
                group=self.group,
                attempt=message.deliver_count,
            )


def _decompress(message: Message) -> None:
    """Decompress a snappy body in place; one that does not decompress reaches the listener as it came.

    KiteQ's Go consumer does the same, so a producer that set the flag on a plain body
    still has its messages delivered. `message.snappy` stays True then, to tell.
    """
    try:
        message.body = decompress(message.body)
    except CorruptBody as exc:
        log.warning(
            "consumer.body_not_decompressed",
            message_id=message.message_id,
            error=str(exc),
            detail="the listener gets the body as it came, with message.snappy still True",
        )
        return
    message.snappy = False
