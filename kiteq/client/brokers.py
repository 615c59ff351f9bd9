"""The client's view of the brokers: one connection per broker serving our topics.

Broker lists come from registry watches; a link task per broker address keeps a
connection up, reconnecting with capped exponential backoff, until the address
leaves the registry. Sends pick a live connection for the topic at random.
"""

from __future__ import annotations

import random
import ssl
from collections.abc import Callable, Iterable

import structlog
import trio

from kiteq.client.connection import ClientConnection, Credentials, RequestHandler
from kiteq.errors import AuthError, ConnectionClosed, SendError, TLSError, leaf_error
from kiteq.registry import Registry

log = structlog.get_logger(__name__)

RECONNECT_BASE = 0.2
RECONNECT_MAX = 30.0


class BrokerPool:
    def __init__(
        self,
        registry: Registry,
        topics: Iterable[str],
        credentials: Credentials,
        on_request: RequestHandler | None = None,
        answers_due: Callable[[], int] = lambda: 0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.registry = registry
        self.topics = sorted(set(topics))
        self.credentials = credentials
        self.on_request = on_request
        self.answers_due = answers_due
        self.tls = tls
        self.servers: dict[str, list[str]] = {}
        self.connections: dict[str, ClientConnection] = {}
        self._links: dict[str, trio.CancelScope] = {}
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        # A refusal that retrying as is cannot fix (credentials, certificates): raised to callers.
        self.refused: AuthError | TLSError | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for topic in self.topics:
                await nursery.start(self.registry.watch_servers, topic, self._servers_changed(topic))
            task_status.started()

    def _servers_changed(self, topic: str) -> Callable[[list[str]], None]:
        def on_change(addresses: list[str]) -> None:
            self.servers[topic] = list(addresses)
            wanted = {a for addrs in self.servers.values() for a in addrs}
            for address in wanted - set(self._links):
                scope = self._links[address] = trio.CancelScope()
                assert self._nursery is not None
                self._nursery.start_soon(self._link, address, scope)
            for address in set(self._links) - wanted:
                self._links.pop(address).cancel()
            self._notify()

        return on_change

    async def _link(self, address: str, scope: trio.CancelScope) -> None:
        delay = RECONNECT_BASE
        with scope:
            while True:
                connection = ClientConnection(
                    address, self.credentials, self.on_request, answers_due=self.answers_due, tls=self.tls
                )
                try:
                    await self._serve(address, connection)
                    delay = RECONNECT_BASE
                except* (AuthError, TLSError) as group:
                    self.refused = leaf_error(group, (AuthError, TLSError))  # type: ignore[assignment]
                    log.error("client.refused", broker=address, error=str(self.refused))
                    self._notify()
                except* (OSError, trio.TooSlowError, ConnectionClosed) as group:
                    error = leaf_error(group, (OSError, trio.TooSlowError, ConnectionClosed))
                    log.info(
                        "client.connect_failed", broker=address, error=str(error) or type(error).__name__
                    )
                finally:
                    if self.connections.get(address) is connection:
                        del self.connections[address]
                        self._notify()
                await trio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, RECONNECT_MAX)

    async def _serve(self, address: str, connection: ClientConnection) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(connection.run)
            self.connections[address] = connection
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def live(self, topic: str | None = None) -> list[ClientConnection]:
        addresses = self.servers.get(topic, []) if topic is not None else list(self.connections)
        return [c for a in addresses if (c := self.connections.get(a)) is not None and c.alive]

    async def connection_for(self, topic: str, timeout: float) -> ClientConnection:
        """A random live connection to a broker serving `topic`, waiting up to `timeout` for one."""
        connection = self._pick(topic)
        if connection is not None:  # the usual case, without a cancel scope per send
            return connection
        with trio.move_on_after(timeout):
            while (connection := self._pick(topic)) is None:
                await self._changed.wait()
            return connection
        raise SendError(f"no broker serving topic {topic!r} is reachable (registry {self.registry.uri})")

    def _pick(self, topic: str) -> ClientConnection | None:
        """A random live connection for `topic`, None if there is none; raises a refusal."""
        if self.refused is not None:
            raise self.refused
        live = self.live(topic)
        return random.choice(live) if live else None

    async def connection_to(self, address: str, timeout: float) -> ClientConnection | None:
        with trio.move_on_after(timeout):
            while True:
                connection = self.connections.get(address)
                if connection is not None and connection.alive:
                    return connection
                await self._changed.wait()
        return None

    async def close(self, timeout: float) -> None:
        """Flush every connection's queued frames (in parallel), each bounded by `timeout`."""
        async with trio.open_nursery() as nursery:
            for connection in list(self.connections.values()):
                nursery.start_soon(connection.close, timeout)

    async def wait_connected(self, timeout: float) -> bool:
        """True once every topic has a live broker connection (or False after `timeout`)."""
        with trio.move_on_after(timeout):
            while not all(self.live(topic) for topic in self.topics):
                if self.refused is not None:
                    raise self.refused
                await self._changed.wait()
            return True
        return False
