"""This process's ephemeral nodes: the ones it wants, kept so they outlive a lost session.

After a session expiry (LOST) ZooKeeper deleted them; kazoo opens a new session and
`reregister` (the bridge's reconnect hook, on a kazoo-spawned thread) creates them
again without a restart. A registration made while ZooKeeper is away is remembered
and applied when it returns. A node carries the data it was registered with (a
broker's admin URL; empty for the others); registering it again with other data
re-creates it. Worker threads and kazoo threads both touch the wanted nodes, so they
are kept under one threading lock; what to delete and create is decided by `plan`,
which does no I/O.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from structlog.typing import FilteringBoundLogger

from kiteq.registry.zk.bridge import UNREACHABLE, Bridge, gather, wait


@dataclass(frozen=True, slots=True)
class Plan:
    """What makes ZooKeeper hold exactly the wanted nodes: every deletion, then every creation."""

    delete: list[str]
    create: list[str]


def plan(
    wanted: Collection[str],
    withdrawn: Collection[str],
    owners: Mapping[str, int],
    session: int | None,
    stale: Collection[str] = (),
) -> Plan:
    """Decide from the existing nodes' ephemeral owners (`owners`; a path not in it has no node).

    A withdrawn node is deleted only if this session holds it: another's is not ours to
    take. A wanted node held by another session (our own previous run, not yet expired)
    is replaced, as KiteQ does, or it would vanish when that session expires; so is a
    `stale` one, ours but holding data registered before.
    """
    owned = {path for path, owner in owners.items() if owner == session}
    held = owned - set(stale)
    missing = sorted(path for path in wanted if path not in held)
    return Plan(
        delete=[path for path in sorted(withdrawn) if path in owned] + [p for p in missing if p in owners],
        create=missing,
    )


class Ephemerals:
    """The ephemeral nodes this process registered, applied now or when ZooKeeper is back."""

    def __init__(self, bridge: Bridge, log: FilteringBoundLogger) -> None:
        self._bridge = bridge
        self._log = log
        self._lock = threading.Lock()
        self._wanted: dict[str, bytes] = {}  # path -> data
        self._withdrawn: set[str] = set()
        self._stale: set[str] = set()  # wanted, but ZooKeeper may hold them with older data
        self._by_key: dict[str, set[str]] = {}

    def add(self, client: KazooClient, nodes: Mapping[str, bytes], deadline: float) -> None:
        """Want these nodes (path -> data) too (a producer's)."""
        with self._lock:
            self._change_locked(client, nodes, set(), deadline)

    def replace(self, client: KazooClient, key: str, nodes: Mapping[str, bytes], deadline: float) -> None:
        """Make `nodes` the ones registered under `key` (a broker's address, a node's path); withdraw its others."""
        with self._lock:
            previous = self._by_key.pop(key, set())
            if nodes:
                self._by_key[key] = set(nodes)
            self._change_locked(client, nodes, previous - nodes.keys(), deadline)

    def reregister(self, client: KazooClient) -> None:
        """The bridge's reconnect hook: re-create what a lost session took."""
        with self._lock:
            try:
                count = self._reconcile_locked(client, time.monotonic() + self._bridge.op_timeout)
            except (*UNREACHABLE, KazooException) as exc:
                self._log.warning("registry.reregister_failed", error=repr(exc))
                return
        if count:
            self._log.info("registry.reregistered", nodes=count)

    def withdraw_all(self, client: KazooClient) -> None:
        """The bridge's hook before closing: delete our nodes now, not at session timeout."""
        with self._lock:
            self._withdrawn |= self._wanted.keys()
            self._wanted.clear()
            self._stale.clear()
            self._by_key.clear()
            if self._bridge.connected:
                try:
                    self._reconcile_locked(client, time.monotonic() + self._bridge.op_timeout)
                except (*UNREACHABLE, KazooException) as exc:
                    self._log.warning("registry.withdraw_failed", error=repr(exc))

    def _change_locked(
        self, client: KazooClient, add: Mapping[str, bytes], remove: set[str], deadline: float
    ) -> None:
        """Change the wanted nodes and apply; while ZooKeeper is away, apply on reconnect.

        `connected` is read under the lock, after the change: a reconnect's `reregister`
        either ran before (and we apply now) or waits for the lock (and applies ours).
        """
        # Ours with other data, or ours to delete still (withdrawn while away): created anew.
        self._stale |= {
            path
            for path, data in add.items()
            if self._wanted.get(path, data) != data or path in self._withdrawn
        }
        for path in remove:
            self._wanted.pop(path, None)
        self._wanted.update(add)
        self._withdrawn = (self._withdrawn | remove) - self._wanted.keys()
        if not self._bridge.connected:
            self._log.warning("registry.registration_deferred", added=len(add), removed=len(remove))
            return
        try:
            self._reconcile_locked(client, deadline)
        except UNREACHABLE as exc:
            self._log.warning("registry.registration_deferred", error=type(exc).__name__)

    def _reconcile_locked(self, client: KazooClient, deadline: float) -> int:
        """Make ZooKeeper hold exactly the wanted nodes; the number (re)created."""
        session = client.client_id[0] if client.client_id else None
        paths = sorted(self._withdrawn | self._wanted.keys())
        stats = gather([client.exists_async(path) for path in paths], deadline)
        owners = {
            path: stat.ephemeralOwner for path, stat in zip(paths, stats, strict=True) if stat is not None
        }
        todo = plan(self._wanted, self._withdrawn, owners, session, self._stale)
        for path in todo.delete:
            with contextlib.suppress(NoNodeError):
                wait(client.delete_async(path), deadline)
        self._withdrawn.clear()
        for path in todo.create:
            wait(client.create_async(path, self._wanted[path], ephemeral=True, makepath=True), deadline)
        self._stale.clear()
        return len(todo.create)
