"""`ZooKeeperRegistry`: the `Registry` interface over KiteQ's tree in ZooKeeper.

What the interface promises on top of the parts: names are checked before anything
is sent, reads answer from the last value read while ZooKeeper is away, brokers, their
admin endpoints and producers are ephemeral nodes that survive a lost session, watches
deliver the full value. The parts: `bridge` (kazoo <-> Trio), `tree` (paths, reads,
writes), `ephemerals` (our nodes, re-created after a reconnect).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import structlog
import trio
from kazoo.client import KazooClient

from kiteq.registry.base import BindingsCallback, Registry, ServersCallback
from kiteq.registry.bindings import Binding, merge_binding
from kiteq.registry.zk.bridge import DEFAULT_OP_TIMEOUT, Bridge, Watch, Work, ZooKeeperUnavailable
from kiteq.registry.zk.ephemerals import Ephemerals
from kiteq.registry.zk.tree import Tree, admin_path, bind_path, node_name, producer_path, server_path
from kiteq.registry.zk.uri import DEFAULT_CONNECT_TIMEOUT, DEFAULT_SESSION_TIMEOUT, parse_zk_uri

log = structlog.get_logger(__name__)

T = TypeVar("T")


class ZooKeeperRegistry(Registry):
    """The registry in ZooKeeper; the timeouts are read at `start`, so a caller may lower them before."""

    def __init__(
        self,
        hosts: str,
        chroot: str = "",
        *,
        session_timeout: float = DEFAULT_SESSION_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        uri: str = "",
    ) -> None:
        self.hosts = hosts
        self.chroot = chroot
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        self.uri = uri or f"zk://{hosts}{chroot}"
        self._log = log.bind(registry=self.uri)
        self._bridge = Bridge(hosts, op_timeout=op_timeout, log=self._log)
        self._tree = Tree(f"{chroot}/kiteq", self._log)
        self._ephemerals = Ephemerals(self._bridge, self._log)
        self._cache: dict[tuple[object, ...], Any] = {}

    @classmethod
    def from_uri(cls, uri: str) -> ZooKeeperRegistry:
        hosts, chroot, options = parse_zk_uri(uri)
        return cls(
            hosts,
            chroot,
            session_timeout=options.get("session_timeout", DEFAULT_SESSION_TIMEOUT),
            connect_timeout=options.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT),
            uri=uri,
        )

    # -- state ----------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._bridge.connected

    @property
    def state(self) -> str:
        """kazoo's view of the session: CONNECTED, SUSPENDED, LOST, or CLOSED (for stats)."""
        return self._bridge.state

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """The ZooKeeper session (id, password); for diagnostics and session-expiry tests."""
        client = self._bridge.client
        return client.client_id if client is not None else None

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Open a session within `connect_timeout` (else ZooKeeperUnavailable) and make the root."""
        client = await self._bridge.start(
            session_timeout=self.session_timeout,
            connect_timeout=self.connect_timeout,
            on_reconnect=self._ephemerals.reregister,
        )
        try:
            await self._bridge.call(self._tree.ensure_root)
        except BaseException:
            await self.close()
            raise
        self._log.info("registry.started", session=f"{client.client_id[0]:#x}")

    async def close(self) -> None:
        """Delete this process's ephemeral nodes now (not at session timeout) and end the session."""
        await self._bridge.close(self._ephemerals.withdraw_all)

    async def _read(self, key: tuple[object, ...], work: Work[T]) -> T:
        """A read that answers from the last value read while ZooKeeper is away."""
        if not self.connected and key in self._cache:
            return self._cache[key]
        try:
            value = await self._bridge.call(work, read=True)
        except ZooKeeperUnavailable:
            if key in self._cache:
                self._log.warning("registry.stale_read", what=key[0])
                return self._cache[key]
            raise
        self._cache[key] = value
        return value

    # -- servers and producers ----------------------------------------------------------

    async def register_server(self, address: str, topics: Iterable[str]) -> None:
        nodes = dict.fromkeys((server_path(self._tree.root, t, address) for t in topics), b"")
        node_name("address", address)  # also with no topics
        await self._bridge.call(
            lambda client, deadline: self._ephemerals.replace(client, address, nodes, deadline),
            offline_ok=True,
        )

    async def unregister_server(self, address: str) -> None:
        """Withdraw a broker this process registered (others' nodes go with their sessions).

        After `close()` this does nothing: closing already withdrew every node.
        """
        if self._bridge.client is None:
            return
        await self.register_server(address, ())

    async def list_servers(self, topic: str | None = None) -> dict[str, list[str]]:
        return await self._read(
            ("servers", topic), lambda client, deadline: self._tree.read_servers(client, deadline, topic)
        )

    async def register_admin(self, address: str, url: str) -> None:
        path = admin_path(self._tree.root, address)
        await self._bridge.call(
            lambda client, deadline: self._ephemerals.replace(client, path, {path: url.encode()}, deadline),
            offline_ok=True,
        )

    async def list_admins(self) -> dict[str, str]:
        return await self._read(("admins",), self._tree.read_admins)

    async def register_producer(self, address: str, group: str, topics: Iterable[str]) -> None:
        nodes = dict.fromkeys((producer_path(self._tree.root, t, group, address) for t in topics), b"")
        await self._bridge.call(
            lambda client, deadline: self._ephemerals.add(client, nodes, deadline), offline_ok=True
        )

    async def list_producers(self) -> dict[str, dict[str, list[str]]]:
        return await self._read(("producers",), self._tree.read_producers)

    # -- bindings -------------------------------------------------------------------

    async def put_bindings(self, group: str, topic: str, bindings: list[Binding]) -> None:
        checked: list[Binding] = []
        for binding in bindings:
            checked = merge_binding(checked, binding.with_group(group))
        path = bind_path(self._tree.root, topic, group)
        await self._bridge.call(
            lambda client, deadline: self._tree.put_bindings(client, deadline, path, checked)
        )

    async def add_binding(self, binding: Binding) -> None:
        path = bind_path(self._tree.root, binding.topic, binding.group)
        await self._bridge.call(
            lambda client, deadline: self._tree.add_binding(client, deadline, path, binding)
        )

    async def remove_binding(self, group: str, topic: str, message_type: str | None = None) -> int:
        path = bind_path(self._tree.root, topic, group)
        return await self._bridge.call(
            lambda client, deadline: self._tree.remove_binding(client, deadline, path, message_type)
        )

    async def list_bindings(self, topic: str | None = None, group: str | None = None) -> list[Binding]:
        return await self._read(
            ("bindings", topic, group),
            lambda client, deadline: self._tree.read_bindings(client, deadline, topic, group),
        )

    # -- watches ------------------------------------------------------------------

    async def watch_bindings(
        self, on_change: BindingsCallback, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await self._bridge.watch(
            "bindings",
            lambda client, deadline, watch: self._tree.read_bindings(client, deadline, watch=watch),
            on_change,
            task_status,
        )

    async def watch_servers(
        self,
        topic: str,
        on_change: ServersCallback,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        node_name("topic", topic)

        def read(client: KazooClient, deadline: float, watch: Watch) -> list[str]:
            return self._tree.read_servers(client, deadline, topic, watch).get(topic, [])

        await self._bridge.watch(f"servers:{topic}", read, on_change, task_status)
