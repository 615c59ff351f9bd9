"""The broker: one nursery tree that owns every task, and the wiring of its parts.

    Broker.run
    ├── dispatcher (lane pumps, completion recorder)
    ├── registry watch (bindings -> ACL -> router, lanes, served topics)
    ├── recover loop, tx back-scan, pending-request expiry, refusal summaries,
    │   delivery-log flusher, adoption of dead brokers' rows (shared stores)
    ├── admin HTTP endpoint
    └── TCP listener -> one BrokerConnection per client (reader, writer, request tasks)

What a request does is in `handlers.py`; who may connect in `auth.py` and
`admission.py`; what a connection may send in `protocol/session.py`. Parts are
given their collaborators and hooks when they are built, in `__init__`.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import structlog
import trio

from kiteq.config import BrokerConfig
from kiteq.delivery_log import DeliveryLog
from kiteq.errors import AddressInUse
from kiteq.registry import Registry, open_registry
from kiteq.registry.admin_url import admin_url
from kiteq.registry.bindings import Binding
from kiteq.server.acl import Acl
from kiteq.server.admin.app import AdminApp
from kiteq.server.admin.browse import MessageBrowser
from kiteq.server.admin.dlq import DeadLetters
from kiteq.server.admin.serve import serve_admin
from kiteq.server.admission import Admission
from kiteq.server.adoption import AdoptLoop
from kiteq.server.auth import Authenticator
from kiteq.server.cancel import Cancelled, cancel_scheduled
from kiteq.server.clock import WallClock, system_clock
from kiteq.server.connection import BrokerConnection
from kiteq.server.delivery.dispatcher import Dispatcher
from kiteq.server.delivery.recover import RecoverLoop, RecoverSignal
from kiteq.server.events import Events
from kiteq.server.groups import GroupTable
from kiteq.server.handlers import Handlers
from kiteq.server.history import History, sample_every
from kiteq.server.latency import Latencies
from kiteq.server.refusals import RefusalLog
from kiteq.server.routing import Router
from kiteq.server.stats import group_and_topic_rows, scheduled_summary
from kiteq.server.tx.backscan import TxBackscan
from kiteq.tls import server_context
from protocol.logevents import LogEvent
from protocol.session import Hello, quote
from stores import MessageStore, SharedStore, open_store

log = structlog.get_logger(__name__)

EXPIRY_TICK = 0.1
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)  # Linux 3.12+
NOTSENT_LOWAT_BYTES = 64 * 1024
SHUTDOWN_GRACE = 10.0
ACCEPT_RETRY = 0.1


class Broker:
    handlers: Handlers  # made once the listening address is known (messages record it)

    def __init__(
        self,
        config: BrokerConfig,
        *,
        store: MessageStore | None = None,
        registry: Registry | None = None,
        clock: WallClock = system_clock,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store or open_store(config.server.store)
        self.registry = registry or open_registry(config.server.registry)
        self.address = config.server.bind
        self.admin_address = ""
        self.tls = server_context(config.tls)
        delivery_log = (
            DeliveryLog(config.server.delivery_log, "broker", max_bytes=config.server.delivery_log_max_bytes)
            if config.server.delivery_log
            else None
        )
        self.events = Events(delivery_log)
        self.latency = Latencies(clock)
        self.events.subscribe(self.latency.observe, LogEvent.ACKED, LogEvent.STORED)
        self.history = History(config.server.history_interval)
        self.router = Router()
        self.groups = GroupTable()
        self.refusals = RefusalLog()
        self.acl = Acl(config.acl)
        self.denied_bindings: list[Binding] = []
        self.authenticator = Authenticator(config.auth)
        server = config.server
        self.admission = Admission(
            server.max_connections, server.max_unauthenticated, server.max_unauthenticated_per_address
        )
        self.recover_signal = RecoverSignal(clock)
        self.dispatcher = Dispatcher(
            self.store,
            self.router,
            self.groups,
            config.delivery,
            self.events,
            clock=clock,
            on_capacity=self.recover_signal.wake,
            on_retry=self.recover_signal.retry_at,
        )
        self.recover = RecoverLoop(self.store, self.dispatcher, config.delivery, self.recover_signal)
        self.backscan = TxBackscan(self.store, self.groups, config.tx, self.events, clock=clock)
        self.dead_letters = DeadLetters(self.store, self.dispatcher, self.events)
        self.messages = MessageBrowser(
            self.store, self.router, delivery_log.path if delivery_log is not None else None, clock
        )
        self.connections: set[BrokerConnection] = set()
        self.awaiting: set[BrokerConnection] = set()  # those with our requests pending
        self.started_at = time.time()
        self.served_topics: tuple[str, ...] = ()
        self._registering = trio.Lock()
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
        with AddressInUse.raised_for(self.config.server.bind, "bind"):
            listeners = await trio.open_tcp_listeners(int(port), host=host)
        self.address = f"{host}:{listeners[0].socket.getsockname()[1]}"
        self.handlers = Handlers(
            self.store,
            self.dispatcher,
            self.events,
            self.acl,
            self.refusals,
            address=self.address,
            clock=self.clock,
        )
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
            nursery.start_soon(sample_every, self.history, self.clock, self.stats, self.latency.roll)
            if isinstance(self.store, SharedStore):
                adoption = AdoptLoop(
                    self.store, self.registry, self.config.server.adopt_after, self.recover_signal.wake
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
        server = self.config.server
        if not server.admin_bind:
            return
        app = AdminApp(self, server.admin_token)
        with AddressInUse.raised_for(server.admin_bind, "admin_bind"):
            bound = await nursery.start(serve_admin, app, server.admin_bind, self.config.tls)
        self.admin_address = bound[0].removeprefix("http://") if bound else self.config.server.admin_bind
        # So `kiteq-admin message …` finds every broker; withdrawn when the registry closes.
        await self.registry.register_admin(
            self.address, admin_url(self.admin_address, self.address, tls=self.config.tls.enabled)
        )

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
        self.dispatcher.sync_lanes(self.router.bindings)  # those the router skipped get no lane
        self.recover_signal.wake()
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
        connection = BrokerConnection(self, self.config.server, stream, peer)
        evicted = self.admission.admit(connection, connection.address)
        if evicted is None:
            self.refusals.refused("connection.refused", conn=peer, reason="max_connections reached")
            await trio.aclose_forcefully(stream)
            return
        for victim in evicted:
            victim.evict()  # type: ignore[attr-defined]
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        # Little unsent data waits in the kernel behind a slow reader (it waits in our bulk
        # lane instead, where control frames overtake it and its timeouts have not started).
        stream.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, NOTSENT_LOWAT_BYTES)
        self.connections.add(connection)
        try:
            await connection.serve()
        except Exception:  # one connection's failure must not stop the broker
            log.exception("connection.failed", conn=peer)
        finally:
            self.connections.discard(connection)
            self.awaiting.discard(connection)
            self.admission.closed(connection)
            if connection.authenticated:
                self.groups.remove(connection)
                log.info("connection.closed", conn=peer, group=connection.group)

    def authenticate(self, connection: BrokerConnection, hello: Hello) -> str:
        """'' if the connection may act as `hello.group`, else the reason sent back (never the secret)."""
        refusal = self.authenticator.check(hello.group, hello.secret, connection.address, time.monotonic())
        if refusal is None:
            return ""
        self.refusals.refused(
            refusal.kind,
            conn=connection.peer,
            group=quote(hello.group),
            known_group=hello.group in self.authenticator.secrets,
        )
        return refusal.reason

    def drained(self, connection: BrokerConnection) -> None:
        self.groups.drained(connection.group)

    def authenticated(self, connection: BrokerConnection) -> None:
        self.admission.authenticated(connection)
        self.groups.add(connection)
        self.recover_signal.wake()
        self.backscan.producer_connected(connection.group)

    async def _expire_requests(self) -> None:
        """Time out deliveries and transaction checks, on the connections that have any
        pending. Walking every connection each tick cost the event loop a pause that grew
        with the connections open, idle ones included."""
        while True:
            await trio.sleep(EXPIRY_TICK)
            now = trio.current_time()
            for connection in list(self.awaiting):
                if not connection.expire(now):
                    self.awaiting.discard(connection)

    # -- introspection ------------------------------------------------------------------------

    async def cancel(self, message_id: str) -> Cancelled:
        """An operator's cancel of a scheduled message (the admin endpoint's POST /messages/{id}/cancel)."""
        return await cancel_scheduled(self.store, self.dispatcher, self.events, message_id, None)

    async def stats(self) -> dict[str, Any]:
        """A JSON snapshot for /stats, /metrics, `kiteq-admin stats|top` and the dashboard."""
        store_stats = await self.store.stats()
        lanes = self.dispatcher.lane_stats()
        connections = self.groups.groups()
        groups, topics, totals = group_and_topic_rows(
            self.router.bindings,
            store_stats.waiting,
            store_stats.backlog_by_topic,
            connections,
            lanes,
            self.events.counts,
            self.clock(),
        )
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
            "routing": self.router.stats(),
            "groups": groups,
            "topics": topics,
            "lanes": lanes,
            "rounds_in_flight": len(self.dispatcher.rounds),
            "tx": {
                "questions_in_flight": dict(self.backscan.inflight),
                "waiting_for_producer": dict(self.backscan.waiting),
            },
            "dead_letters": {"total": store_stats.dead, "by_reason": store_stats.dead_by_reason},
            "scheduled": scheduled_summary(
                store_stats.scheduled_by_topic, store_stats.scheduled_by_hour, self.clock()
            ),
            "store": {
                "kind": store_stats.kind,
                "messages": store_stats.messages,
                "uncommitted": store_stats.uncommitted,
                "dead": store_stats.dead,
                "dead_by_reason": store_stats.dead_by_reason,
                "backlog_by_topic": store_stats.backlog_by_topic,
                "details": store_stats.details,
            },
            "events": totals,
            "latency": self.latency.snapshot(),
        }
