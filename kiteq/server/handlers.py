"""What the broker does with a client's requests: store messages, apply tx decisions,
cancel scheduled messages.

A message's path reads top to bottom in `produce`: validate -> authorize -> stage ->
dispatch -> durable -> ack. The connection a request came on is seen only through `Requester`
(who it is, and how to answer it), so this module knows nothing of sockets.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from kiteq.server.acl import Acl
from kiteq.server.cancel import Cancelled, cancel_scheduled
from kiteq.server.clock import WallClock
from kiteq.server.delivery.dispatcher import Dispatcher
from kiteq.server.delivery.rounds import first_due
from kiteq.server.events import Events
from kiteq.server.refusals import RefusalLog
from kiteq.server.tx.decisions import apply_decision, decision_of
from kiteq.server.validate import InvalidMessage, Limits, validate_message
from protocol import TxStatus
from protocol.logevents import LogEvent
from protocol.schedule import deliver_at_of
from protocol.session import CancelRequested, MessageReceived, TxDecision, quote
from stores import MessageStore, StoreError, entity_from_wire, idle
from stores.base import Staged
from stores.entity import MessageEntity

log = structlog.get_logger(__name__)

STORED = "Store Result true"
STORED_BEFORE = "Store Result true (duplicate, stored once)"


class Requester(Protocol):
    """The connection a request came on, as the handlers see it."""

    peer: str

    @property
    def group(self) -> str: ...

    def store_ack(self, opaque: int, message_id: str, stored: bool, feedback: str) -> None: ...

    def busy(self) -> bool:
        """More frames are on their way on this connection (other sends in flight)."""
        ...

    def trickling(self, messages: int) -> bool:
        """Whether a read of `messages` says the sender sends them spaced out (paced)."""
        ...


@dataclass(frozen=True, slots=True)
class StagedRead:
    """A read's messages in the store's state, waiting to be durable: (opaque, entity, wire
    body) of each, the store's answer, and when the read was handled and staged."""

    pending: list[tuple[int, MessageEntity, bytes]]
    staged: Staged
    now: float
    started: float


class Handlers:
    def __init__(
        self,
        store: MessageStore,
        dispatcher: Dispatcher,
        events: Events,
        acl: Acl,
        refusals: RefusalLog,
        *,
        address: str,
        clock: WallClock,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.events = events
        self.acl = acl
        self.refusals = refusals
        self.address = address
        self.clock = clock
        self.limits = Limits(max_delay=dispatcher.config.max_delay)

    @property
    def stages_at_once(self) -> bool:
        """Whether `stage` returns without waiting (the store's `stages_at_once`)."""
        return self.store.stages_at_once

    async def produce(self, requester: Requester, requests: Sequence[MessageReceived]) -> None:
        """Validate, stage, dispatch, then ack the messages of one read once durable.

        They are saved together (one fsync, one INSERT). A message goes to its groups as
        soon as the store holds it, while the store syncs it (`stage_many`), and is acked
        only once it is as durable as the store promises: a consumer never waits on an
        fsync, a producer's store-ack always does. On a store with nothing to sync (the
        memory store) the ack waits instead for the tasks ready to run, the deliveries
        among them. A delayed one (`kiteq.deliverAt` ahead) is stored due then, and the
        recover loop is told when. The two halves, `stage` and `acknowledge`, may run in
        different tasks: a connection's reader stages what it read, and a task of its own
        waits for the sync (BrokerConnection._store).
        """
        staged = await self.stage(requester, requests)
        if staged is not None:
            await self.acknowledge(requester, staged)

    async def stage(self, requester: Requester, requests: Sequence[MessageReceived]) -> StagedRead | None:
        """Validate and stage a read's messages, and hand those due now to their groups.

        What is refused (invalid, not allowed, or the store failed) is answered here, as is
        a fly message; None when nothing is left to acknowledge.
        """
        now = self.clock()
        pending: list[tuple[int, MessageEntity, bytes]] = []
        acl = self.acl if self.acl.restricts else None
        for request in requests:
            opaque, sent = request.opaque, request.raw
            entity = entity_from_wire(request.message)
            try:
                validate_message(entity, now, self.limits)
                if acl is not None and not acl.may_publish(requester.group, entity.topic):
                    raise InvalidMessage(
                        f"group {quote(requester.group)} may not publish to topic {quote(entity.topic)} "
                        "([acl] publish)"
                    )
            except InvalidMessage as exc:
                requester.store_ack(opaque, entity.message_id, False, str(exc))
                continue
            entity.created_at = now
            entity.broker = self.address
            if entity.fly:
                entity.next_deliver_at = first_due(now, self.dispatcher.config.deliver_timeout, True)
                requester.store_ack(opaque, entity.message_id, True, "FLY NO NEED SAVE")
                self.dispatcher.submit(entity, sent)
                continue
            pending.append((opaque, entity, sent))
        if not pending:
            return None
        entities = [entity for _, entity, _ in pending]
        deliver_now = self.dispatcher.admit(entities, now)
        started = time.perf_counter()
        try:
            # No deadline here: every store bounds its own waits (a stalled disk, a database
            # that does not answer) and raises StoreError; a cancel scope per save cost the
            # broker a few per cent of its CPU per message.
            staged = await self.store.stage_many(entities)
        # `failure`, not `exc`: compiled, that name keeps the type of the InvalidMessage above.
        except StoreError as failure:
            self._refuse(requester, pending, failure)
            return None
        # Delivered while the store syncs: a consumer never waits on an fsync.
        for (_, entity, sent), new, now_or_later in zip(pending, staged.saved, deliver_now, strict=True):
            if new and entity.commit and now_or_later:
                self.dispatcher.submit(entity, sent)
        return StagedRead(pending, staged, now, started)

    async def acknowledge(self, requester: Requester, read: StagedRead) -> None:
        """Ack a staged read's messages once they are as durable as the store promises."""
        try:
            # Not written on the loop's thread at once while the sender has more on its way.
            await read.staged.durable(busy=requester.busy, trickling=requester.trickling(len(read.pending)))
            store_ms = round((time.perf_counter() - read.started) * 1000, 3)
        except StoreError as failure:
            self._refuse(requester, read.pending, failure)
            return
        for (_, entity, _), stored in zip(read.pending, read.staged.saved, strict=True):
            if not stored:
                continue
            groups = self.dispatcher.target_groups(entity) if self.events.recorded else None
            self.events.emit(LogEvent.STORED, entity, commit=entity.commit, groups=groups, store_ms=store_ms)
            if (at := deliver_at_of(entity.properties)) is not None and at > read.now:
                self.events.emit(LogEvent.SCHEDULED, entity, deliver_at=round(at * 1000), groups=groups)
                if entity.commit:
                    self.dispatcher.on_retry(at)
        if not self.store.durable:
            # Nothing synced, so nothing paced the ack: acked at once, a producer's window
            # of sends outran the consumers end to end, and what it sent waited in the
            # broker (the memory store, unthrottled: p50 3.7-6.3 ms, p99 16-34 ms, against
            # 1.9-2.2 and 5.1-5.2 once the tasks ready to run went first; stores/idle.py).
            await idle.after_ready_tasks()
        # Acked only now: a store-ack says the message is as durable as the store promises.
        for (opaque, entity, _), stored in zip(read.pending, read.staged.saved, strict=True):
            requester.store_ack(opaque, entity.message_id, True, STORED if stored else STORED_BEFORE)

    @staticmethod
    def _refuse(
        requester: Requester, pending: list[tuple[int, MessageEntity, bytes]], failure: StoreError
    ) -> None:
        """The store failed them: the producer is told to resend (stored ids are stored once)."""
        log.warning("message.store_failed", conn=requester.peer, messages=len(pending), error=str(failure))
        feedback = f"Store Result false: {failure}; resend the message"
        for opaque, entity, _ in pending:
            requester.store_ack(opaque, entity.message_id, False, feedback)

    async def cancel(self, requester: Requester, request: CancelRequested) -> None:
        """A producer's cancel of a scheduled message of its own group, answered either way."""
        try:
            outcome = await cancel_scheduled(
                self.store, self.dispatcher, self.events, request.message_id, request.group
            )
        except StoreError as exc:
            outcome = Cancelled(False, f"the store failed ({exc}); ask again")
        if not outcome.done:
            self.refusals.refused(
                "cancel.refused", conn=requester.peer, message_id=quote(request.message_id), why=outcome.why
            )
        requester.store_ack(request.opaque, request.message_id, outcome.done, outcome.why or "cancelled")

    async def decide(self, requester: Requester, decision: TxDecision) -> None:
        """Apply a producer's commit or rollback, if the message is of its own group."""
        status = decision_of(decision.status)
        if status is TxStatus.UNKNOWN:
            return
        entity: MessageEntity | None = None
        try:
            entity = await self.store.get(decision.message_id)
            if entity is None:
                self.refusals.refused(
                    "tx.unknown_message", conn=requester.peer, message_id=quote(decision.message_id)
                )
                return
            if entity.producer_group != decision.group:
                self.refusals.refused(
                    "tx.wrong_group",
                    conn=requester.peer,
                    group=quote(decision.group),
                    producer_group=quote(entity.producer_group),
                    message_id=entity.message_id,
                    decision=status.name.lower(),
                    detail="only a connection of the message's producer group may decide it",
                )
                return
            await apply_decision(self.store, self.dispatcher, self.events, entity, status)
        except StoreError as exc:
            log.warning(
                "tx.decision_failed",
                conn=requester.peer,
                message_id=entity.message_id if entity else quote(decision.message_id),
                error=str(exc),
                detail="the back-scan will ask again",
            )
