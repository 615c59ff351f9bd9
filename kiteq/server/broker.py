"""The broker: one nursery tree that owns every task.

    Broker.run
    ├── dispatcher (lane pumps, completion recorder)
    ├── registry watch (bindings -> router, lanes, served topics)
    ├── recover loop, tx back-scan, pending-request expiry, delivery-log flusher
    ├── admin HTTP endpoint
    └── TCP listener -> one BrokerConnection per client (reader, writer, request tasks)

Handlers that touch the store (`produce`, `decide`) are methods here so the path
of a message reads top to bottom: validate -> save -> ack -> dispatch.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import Any

import structlog
import trio

from kiteq.config import BrokerConfig
from kiteq.delivery_log import DeliveryLog
from kiteq.registry import Registry, open_registry
from kiteq.registry.bindings import Binding
from kiteq.server.acl import Acl
from kiteq.server.admission import Admission
from kiteq.server.adoption import AdoptLoop
from kiteq.server.auth import Authenticator
from kiteq.server.connection import BrokerConnection
from kiteq.server.delivery.dispatcher import Dispatcher
from kiteq.server.delivery.recover import RecoverLoop
from kiteq.server.events import Events
from kiteq.server.groups import GroupTable
from kiteq.server.refusals import RefusalLog
from kiteq.server.routing import Router
from kiteq.server.tx.backscan import TxBackscan, decision_of
from kiteq.server.tx.decisions import apply_decision
from kiteq.server.validate import InvalidMessage, validate_message
from kiteq.tls import server_context
from protocol import TxStatus
from protocol.session import Hello, MessageReceived, TxDecision, quote
from stores import MessageStore, SharedStore, StoreError, entity_from_wire, open_store
from stores.entity import MessageEntity

log = structlog.get_logger(__name__)

STORE_TIMEOUT = 10.0
IN_FLIGHT_LEASE_FACTOR = 2.0
EXPIRY_TICK = 0.1
SHUTDOWN_GRACE = 10.0
ACCEPT_RETRY = 0.1
# From this many messages in one save, their acks are sent before they are dispatched.
ACKS_FIRST = 16
STORED = "Store Result true"
STORED_BEFORE = "Store Result true (duplicate, stored once)"


class Broker:
    def __init__(
        self, config: BrokerConfig, *, store: MessageStore | None = None, registry: Registry | None = None
    ) -> None:
        self.config = config
        self.store = store or open_store(config.server.store)
        self.registry = registry or open_registry(config.server.registry)
        self.address = config.server.bind
        self.tls = server_context(config.tls)
        self.admin_address = ""
        delivery_log = (
            DeliveryLog(config.server.delivery_log, "broker", max_bytes=config.server.delivery_log_max_bytes)
            if config.server.delivery_log
            else None
        )
        self.events = Events(delivery_log)
        self.router = Router()
        self.groups = GroupTable()
        self.dispatcher = Dispatcher(self.store, self.router, self.groups, config.delivery, self.events)
        self.recover = RecoverLoop(self.store, self.dispatcher, config.delivery)
        self.dispatcher.on_capacity = self.recover.wake
        self.dispatcher.on_retry = self.recover.retry_at
        self.backscan = TxBackscan(self.store, self.groups, config.tx, self.events)
        self.connections: set[BrokerConnection] = set()
        self.started_at = time.time()
        self.served_topics: tuple[str, ...] = ()
        self._registering = trio.Lock()
        server = config.server
        self.admission = Admission(
            server.max_connections, server.max_unauthenticated, server.max_unauthenticated_per_address
        )
        self.authenticator = Authenticator(config.auth)
        self.acl = Acl(config.acl)
        self.denied_bindings: list[Binding] = []
        self.refusals = RefusalLog()
        self._nursery: trio.Nursery | None = None
        self._stop_requested = trio.Event()
        self._accepting = trio.CancelScope()

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until `stop()`; `task_status.started(address)` once listening.

        Stopping is graceful: no new connections, queued deliveries are handed back
        to the store, deliveries in flight get up to SHUTDOWN_GRACE seconds to be
        answered and recorded, then every task ends and the store is closed (flushed).
        Nothing acked is lost: an ack is only ever sent after the save returned.
        """
        host, _, port = self.config.server.bind.rpartition(":")
        if not self.config.auth:
            log.warning("broker.auth_open", detail="no [auth] table: any group and secret is accepted")
        if not self.store.durable:
            log.warning(
                "broker.store_not_durable",
                store=self.store.uri,
                detail="messages are lost when the broker stops",
            )
        listeners = await trio.open_tcp_listeners(int(port), host=host)
        self.address = f"{host}:{listeners[0].socket.getsockname()[1]}"
        try:
            await self._serve(listeners, task_status)
        finally:
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()
        log.info("broker.stopped", address=self.address)

    async def _serve(self, listeners: list[trio.SocketListener], task_status: trio.TaskStatus[str]) -> None:
        if isinstance(self.store, SharedStore):
            # Its rows carry the registered address, stable across restarts on the same port.
            self.store.own_as(self.address)
        async with self.store, self.registry, trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.events.delivery_log is not None:
                self.events.delivery_log.broker = self.address
            await nursery.start(self.dispatcher.run)
            await nursery.start(self.registry.watch_bindings, self._on_bindings)
            await self._register()
            nursery.start_soon(self.recover.run)
            nursery.start_soon(self.backscan.run)
            nursery.start_soon(self._expire_requests)
            nursery.start_soon(self.refusals.run)
            if isinstance(self.store, SharedStore):
                adoption = AdoptLoop(
                    self.store, self.registry, self.config.server.adopt_after, self.recover.wake
                )
                nursery.start_soon(adoption.run)
            if self.events.delivery_log is not None:
                nursery.start_soon(self.events.delivery_log.run)
            await self._start_admin(nursery)
            for listener in listeners:
                nursery.start_soon(self._listen, listener)
            log.info("broker.started", address=self.address, store=self.store.uri, registry=self.registry.uri)
            task_status.started(self.address)
            await self._stop_requested.wait()
            await self._shut_down(nursery, listeners)

    def stop(self) -> None:
        """Ask `run` to shut down gracefully (safe to call more than once)."""
        self._stop_requested.set()

    async def _shut_down(self, nursery: trio.Nursery, listeners: list[trio.SocketListener]) -> None:
        log.info("broker.stopping", inflight=len(self.dispatcher.rounds))
        self.refusals.flush()
        self._accepting.cancel()
        for listener in listeners:
            await listener.aclose()
        await self._unregister()
        self.dispatcher.drain()
        with trio.move_on_after(SHUTDOWN_GRACE):
            await self.dispatcher.drained()
        nursery.cancel_scope.cancel()

    async def _listen(self, listener: trio.SocketListener) -> None:
        with self._accepting:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:  # e.g. out of file descriptors: keep serving the others
                    log.warning("broker.accept_failed", error=str(exc))
                    await trio.sleep(ACCEPT_RETRY)
                    continue
                assert self._nursery is not None
                self._nursery.start_soon(self._accept, stream)

    async def _start_admin(self, nursery: trio.Nursery) -> None:
        if not self.config.server.admin_bind:
            return
        from kiteq.server.admin import serve_admin

        bound = await nursery.start(serve_admin, self)
        self.admin_address = bound[0].removeprefix("http://") if bound else self.config.server.admin_bind

    async def _register(self) -> None:
        # One at a time, so `run` returns from here only once the node is written and two
        # bindings changes in a row cannot reach the registry in the wrong order.
        async with self._registering:
            topics = tuple(sorted(set(self.config.server.topics) | set(self.router.topics)))
            if topics != self.served_topics:
                await self.registry.register_server(self.address, topics)
                self.served_topics = topics

    async def _unregister(self) -> None:
        with trio.move_on_after(5):
            try:
                await self.registry.unregister_server(self.address)
            except Exception as exc:
                log.warning("broker.unregister_failed", error=str(exc))

    def _on_bindings(self, bindings: list[Binding]) -> None:
        if self.acl.restricts:
            bindings, denied = self.acl.split(bindings)
            if denied != self.denied_bindings:
                for binding in denied:
                    log.warning(
                        "acl.binding_denied",
                        group=quote(binding.group),
                        topic=quote(binding.topic),
                        detail="its group may not subscribe to this topic ([acl] subscribe): nothing is delivered for it",
                    )
            self.denied_bindings = denied
        self.router.update(bindings)
        self.dispatcher.sync_lanes(bindings)
        self.recover.wake()
        if self._nursery is not None:
            self._nursery.start_soon(self._register)
        log.info("broker.bindings", count=len(bindings), topics=self.router.topics)

    # -- connections ------------------------------------------------------------------------

    async def _accept(self, stream: trio.SocketStream) -> None:
        try:
            peer_host, peer_port = stream.socket.getpeername()[:2]
            peer = f"{peer_host}:{peer_port}"
        except OSError:
            peer = "?"
        connection = BrokerConnection(self, stream, peer)
        evicted = self.admission.admit(connection, connection.host)
        if evicted is None:
            self.refusals.refused("connection.refused", conn=peer, reason="max_connections reached")
            await trio.aclose_forcefully(stream)
            return
        for victim in evicted:
            victim.evict()  # type: ignore[attr-defined]
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.connections.add(connection)
        try:
            await connection.serve()
        except Exception:  # one connection's failure must not stop the broker
            log.exception("connection.failed", conn=peer)
        finally:
            self.connections.discard(connection)
            self.admission.closed(connection)
            if connection.authenticated:
                self.groups.remove(connection)
                log.info("connection.closed", conn=peer, group=connection.group)

    def authenticate(self, connection: BrokerConnection, hello: Hello) -> str:
        """'' if the connection may act as `hello.group`, else the reason sent back (never the secret)."""
        refusal = self.authenticator.check(hello.group, hello.secret, connection.host, time.monotonic())
        if refusal is None:
            return ""
        self.refusals.refused(
            refusal.kind,
            conn=connection.peer,
            group=quote(hello.group),
            known_group=hello.group in self.authenticator.secrets,
        )
        return refusal.reason

    def connection_authenticated(self, connection: BrokerConnection) -> None:
        self.admission.authenticated(connection)
        self.groups.add(connection)
        self.recover.wake()

    async def _expire_requests(self) -> None:
        while True:
            await trio.sleep(EXPIRY_TICK)
            now = trio.current_time()
            for connection in list(self.connections):
                connection.expire(now)

    # -- handlers -----------------------------------------------------------------------------

    async def produce(self, connection: BrokerConnection, requests: Sequence[MessageReceived]) -> None:
        """Validate, store, ack, then dispatch the messages of one read.

        They are saved together (one fsync, one INSERT), and each is acked only once the
        store has it. Acks go out before dispatch: with a window of sends in flight, how
        fast a producer's next messages arrive depends on how soon its acks leave.
        """
        now = time.time()
        lease = now + IN_FLIGHT_LEASE_FACTOR * self.config.delivery.deliver_timeout
        pending: list[tuple[int, MessageEntity, bytes]] = []
        acl = self.acl if self.acl.restricts else None
        for opaque, cmd, message, sent in requests:
            entity = entity_from_wire(cmd, message)
            try:
                validate_message(entity, now)
                if acl is not None and not acl.may_publish(connection.group, entity.topic):
                    raise InvalidMessage(
                        f"group {quote(connection.group)} may not publish to topic {quote(entity.topic)} ([acl] publish)"
                    )
            except InvalidMessage as exc:
                connection.store_ack(opaque, entity.message_id, False, str(exc))
                continue
            entity.created_at = now
            entity.next_deliver_at = lease
            entity.broker = self.address
            if entity.fly:
                connection.store_ack(opaque, entity.message_id, True, "FLY NO NEED SAVE")
                self.dispatcher.submit(entity, sent)
                continue
            pending.append((opaque, entity, sent))
        if not pending:
            return
        entities = [entity for _, entity, _ in pending]
        # Leased to the delivery about to start: the recover loop must not page a message
        # that is on its way. Every outcome (ack, retry, deferral) rewrites this time; only
        # a crash leaves it, and then the lease's end is when recovery delivers it again.
        # Under a backlog (a lane it routes to is full) it is stored due now instead and
        # left to the recover loop, which saves rewriting the deferral right after.
        deliver_now = self.dispatcher.admit(entities)
        for entity, now_or_later in zip(entities, deliver_now, strict=True):
            entity.next_deliver_at = lease if now_or_later else now
        try:
            started = time.perf_counter()
            with trio.fail_after(STORE_TIMEOUT):
                saved = await self.store.save_many(entities)
            store_ms = round((time.perf_counter() - started) * 1000, 3)
        except (StoreError, trio.TooSlowError) as exc:
            log.warning("message.store_failed", conn=connection.peer, messages=len(entities), error=str(exc))
            feedback = f"Store Result false: {exc or 'store timed out'}; resend the message"
            for opaque, entity, _ in pending:
                connection.store_ack(opaque, entity.message_id, False, feedback)
            return
        for (opaque, entity, _), stored in zip(pending, saved, strict=True):
            connection.store_ack(opaque, entity.message_id, True, STORED if stored else STORED_BEFORE)
        if len(pending) >= ACKS_FIRST:
            # The producer's next sends wait on these acks: let them leave before the dispatch
            # work below (and whatever else is runnable) delays them by milliseconds. Not a
            # cancellation point: these messages are stored, so they are dispatched too.
            await trio.lowlevel.cancel_shielded_checkpoint()
        for (_, entity, sent), stored, now_or_later in zip(pending, saved, deliver_now, strict=True):
            if not stored:
                continue
            groups = self.dispatcher.target_groups(entity) if self.events.recorded else None
            self.events.emit("stored", entity, commit=entity.commit, groups=groups, store_ms=store_ms)
            if entity.commit and now_or_later:
                self.dispatcher.submit(entity, sent)

    async def decide(self, connection: BrokerConnection, decision: TxDecision) -> None:
        """Apply a producer's commit or rollback, if the message is of its own group."""
        status = decision_of(decision.status)
        if status is TxStatus.UNKNOWN:
            return
        entity: MessageEntity | None = None
        try:
            entity = await self.store.get(decision.message_id)
            if entity is None:
                self.refusals.refused(
                    "tx.unknown_message", conn=connection.peer, message_id=quote(decision.message_id)
                )
                return
            if entity.producer_group != decision.group:
                self.refusals.refused(
                    "tx.wrong_group",
                    conn=connection.peer,
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
                conn=connection.peer,
                message_id=entity.message_id if entity else quote(decision.message_id),
                error=str(exc),
                detail="the back-scan will ask again",
            )

    # -- introspection ------------------------------------------------------------------------

    async def stats(self) -> dict[str, object]:
        """A JSON snapshot for /stats, /metrics, `kiteq-admin stats|top` and the dashboard.

        Backlog is the store's committed, unfinished messages per topic; a group's backlog
        is that of the topics it is bound to (a message counts until every group has it).
        Event counts are cumulative: readers derive rates from two snapshots.
        """
        store_stats = await self.store.stats()
        backlog = store_stats.backlog_by_topic
        connections = self.groups.groups()
        lanes = self.dispatcher.lane_stats()
        groups: dict[str, dict[str, Any]] = {}
        topics: dict[str, dict[str, Any]] = {}

        def group_row(group: str) -> dict[str, Any]:
            empty = {"connections": connections.get(group, 0), "inflight": 0, "queued": 0, "backlog": 0}
            return groups.setdefault(group, {**empty, "topics": [], "events": {}})

        def topic_row(topic: str) -> dict[str, Any]:
            return topics.setdefault(topic, {"backlog": backlog.get(topic, 0), "inflight": 0, "events": {}})

        for group in connections:
            group_row(group)
        for topic in backlog:
            topic_row(topic)
        for lane in lanes:
            row, topic = group_row(str(lane["group"])), str(lane["topic"])
            row["inflight"] += lane["inflight"]
            row["queued"] += lane["queued"]
            topic_row(topic)["inflight"] += lane["inflight"]
            if topic not in row["topics"]:
                row["topics"].append(topic)
                row["backlog"] += backlog.get(topic, 0)
        totals: dict[str, int] = {}
        for (event, topic, group), n in self.events.counts.items():
            totals[event] = totals.get(event, 0) + n
            by_topic = topic_row(topic)["events"]
            by_topic[event] = by_topic.get(event, 0) + n
            if group:
                by_group = group_row(group)["events"]
                by_group[event] = by_group.get(event, 0) + n
        return {
            "address": self.address,
            "started_at": self.started_at,
            "uptime": time.time() - self.started_at,
            "connections": {
                "total": len(self.connections),
                "unauthenticated": self.admission.unauthenticated,
                "by_group": connections,
            },
            "security": {
                "auth": "open" if self.authenticator.open else "secrets",
                "tls": self.tls is not None,
                "refusals": self.refusals.totals,
                "denied_bindings": [
                    {"group": b.group, "topic": b.topic, "message_type": b.message_type}
                    for b in self.denied_bindings
                ],
            },
            "registry": {
                "uri": self.registry.uri,
                "connected": self.registry.connected,
                "state": getattr(self.registry, "state", "CONNECTED" if self.registry.connected else "LOST"),
            },
            "groups": dict(sorted(groups.items())),
            "topics": dict(sorted(topics.items())),
            "lanes": lanes,
            "rounds_in_flight": len(self.dispatcher.rounds),
            "dead_letters": {"total": store_stats.dead, "by_reason": store_stats.dead_by_reason},
            "store": {
                "kind": store_stats.kind,
                "messages": store_stats.messages,
                "uncommitted": store_stats.uncommitted,
                "dead": store_stats.dead,
                "dead_by_reason": store_stats.dead_by_reason,
                "backlog_by_topic": backlog,
                "details": store_stats.details,
            },
            "events": totals,
        }
