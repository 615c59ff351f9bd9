"""KiteQ's tree in ZooKeeper: its paths, and its reads and writes.

    {root}/server/{topic}/{host:port}        ephemeral, brokers
    {root}/pub/{topic}/{group}/{host:port}   ephemeral, producers
    {root}/sub/{topic}/{group}-bind          persistent, JSON list of bindings
    {root}/admin/{host:port}                 ephemeral, a broker's admin URL as data (KiteQ-py only)

`root` is `{chroot}/kiteq`. The path functions do no I/O. `Tree`'s methods are blocking
kazoo code for a worker thread (`Bridge.call`): independent requests are issued
together and awaited with the call's deadline.
"""

from __future__ import annotations

import contextlib

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from structlog.typing import FilteringBoundLogger

from kiteq.errors import RegistryError
from kiteq.registry.bindings import Binding, BindingError, decode_bindings, encode_bindings, merge_binding
from kiteq.registry.zk.bridge import Watch, gather, wait

BIND_SUFFIX = "-bind"


def node_name(kind: str, value: str) -> str:
    """A node name from a topic, group or address: one path component."""
    if not value or "/" in value or value in (".", ".."):
        raise RegistryError(f"invalid {kind} {value!r} for ZooKeeper: it must be non-empty and have no '/'")
    return value


def server_path(root: str, topic: str, address: str) -> str:
    return f"{root}/server/{node_name('topic', topic)}/{node_name('address', address)}"


def producer_path(root: str, topic: str, group: str, address: str) -> str:
    return (
        f"{root}/pub/{node_name('topic', topic)}/{node_name('group', group)}/{node_name('address', address)}"
    )


def admin_path(root: str, address: str) -> str:
    return f"{root}/admin/{node_name('address', address)}"


def bind_path(root: str, topic: str, group: str) -> str:
    return f"{root}/sub/{node_name('topic', topic)}/{node_name('group', group)}{BIND_SUFFIX}"


class Tree:
    """Reads and writes of KiteQ's nodes under `root`; for worker threads only."""

    def __init__(self, root: str, log: FilteringBoundLogger) -> None:
        self.root = root
        self._log = log

    def ensure_root(self, client: KazooClient, deadline: float) -> None:
        wait(client.ensure_path_async(self.root), deadline)

    # -- reads --------------------------------------------------------------------------

    def read_servers(
        self, client: KazooClient, deadline: float, topic: str | None = None, watch: Watch | None = None
    ) -> dict[str, list[str]]:
        """topic -> broker addresses, for one topic or all."""
        base = f"{self.root}/server"
        topics = (
            [node_name("topic", topic)]
            if topic is not None
            else _children(client, [base], deadline, watch)[0]
        )
        addresses = _children(client, [f"{base}/{t}" for t in topics], deadline, watch)
        return {t: a for t, a in zip(topics, addresses, strict=True) if a}

    def read_producers(self, client: KazooClient, deadline: float) -> dict[str, dict[str, list[str]]]:
        """topic -> group -> producer addresses."""
        base = f"{self.root}/pub"
        topics = _children(client, [base], deadline)[0]
        groups = _children(client, [f"{base}/{t}" for t in topics], deadline)
        pairs = [(t, g) for t, gs in zip(topics, groups, strict=True) for g in gs]
        addresses = _children(client, [f"{base}/{t}/{g}" for t, g in pairs], deadline)
        found: dict[str, dict[str, list[str]]] = {}
        for (t, g), a in zip(pairs, addresses, strict=True):
            if a:
                found.setdefault(t, {})[g] = a
        return found

    def read_admins(self, client: KazooClient, deadline: float) -> dict[str, str]:
        """Broker address -> admin endpoint URL (a node gone between the two reads is skipped)."""
        base = f"{self.root}/admin"
        addresses = _children(client, [base], deadline)[0]
        values = gather([client.get_async(f"{base}/{a}") for a in addresses], deadline)
        return {
            a: value[0].decode(errors="replace")
            for a, value in zip(addresses, values, strict=True)
            if value is not None
        }

    def read_bindings(
        self,
        client: KazooClient,
        deadline: float,
        topic: str | None = None,
        group: str | None = None,
        watch: Watch | None = None,
    ) -> list[Binding]:
        """Every binding (of a topic, of a group): the whole subtree, re-read in full.

        Reading everything after any event is what keeps a deleted node of one
        group from dropping the other groups' bindings (KiteQ's bug).
        """
        base = f"{self.root}/sub"
        topics = (
            [node_name("topic", topic)]
            if topic is not None
            else _children(client, [base], deadline, watch)[0]
        )
        if group is not None:
            nodes = [bind_path(self.root, t, group) for t in topics]
        else:
            children = _children(client, [f"{base}/{t}" for t in topics], deadline, watch)
            nodes = [
                f"{base}/{t}/{node}"
                for t, names in zip(topics, children, strict=True)
                for node in names
                if node.endswith(BIND_SUFFIX)
            ]
        found: list[Binding] = []
        for node, value in zip(
            nodes, gather([client.get_async(n, watch=watch) for n in nodes], deadline), strict=True
        ):
            if value is None:
                continue
            try:
                found.extend(decode_bindings(value[0]))
            except BindingError as exc:
                self._log.warning("registry.bad_binding_node", node=node, error=str(exc))
        return found

    # -- writes of a `{group}-bind` node -----------------------------------------------

    @staticmethod
    def put_bindings(client: KazooClient, deadline: float, path: str, bindings: list[Binding]) -> None:
        """Replace the node's bindings; no bindings deletes the node."""
        if not bindings:
            with contextlib.suppress(NoNodeError):
                wait(client.delete_async(path), deadline)
            return
        data = encode_bindings(bindings)
        try:
            wait(client.set_async(path, data), deadline)
        except NoNodeError:
            try:
                wait(client.create_async(path, data, makepath=True), deadline)
            except NodeExistsError:
                wait(client.set_async(path, data), deadline)

    @staticmethod
    def add_binding(client: KazooClient, deadline: float, path: str, binding: Binding) -> None:
        """Merge one binding into the node (BindingError on a conflict)."""
        while True:  # compare-and-set: a concurrent writer makes us read again
            try:
                data, stat = wait(client.get_async(path), deadline)
            except NoNodeError:
                try:
                    wait(client.create_async(path, encode_bindings([binding]), makepath=True), deadline)
                    return
                except NodeExistsError:
                    continue
            merged = merge_binding(decode_bindings(data), binding)
            try:
                wait(client.set_async(path, encode_bindings(merged), version=stat.version), deadline)
                return
            except (BadVersionError, NoNodeError):
                continue

    @staticmethod
    def remove_binding(client: KazooClient, deadline: float, path: str, message_type: str | None) -> int:
        """Remove the binding of `message_type` (None: all) from the node; the number removed."""
        while True:  # compare-and-set, as in add_binding
            try:
                data, stat = wait(client.get_async(path), deadline)
            except NoNodeError:
                return 0
            current = decode_bindings(data)
            kept = [b for b in current if message_type is not None and b.message_type != message_type]
            if current and len(kept) == len(current):
                return 0
            try:
                if kept:
                    wait(client.set_async(path, encode_bindings(kept), version=stat.version), deadline)
                else:
                    wait(client.delete_async(path, version=stat.version), deadline)
                return len(current) - len(kept)
            except (BadVersionError, NoNodeError, NotEmptyError):
                continue


def _children(
    client: KazooClient, paths: list[str], deadline: float, watch: Watch | None = None
) -> list[list[str]]:
    """Children of each path ([] for a missing one; its creation is watched)."""
    found = gather([client.get_children_async(p, watch=watch) for p in paths], deadline)
    missing = [p for p, children in zip(paths, found, strict=True) if children is None]
    if watch is not None and missing:
        stats = gather([client.exists_async(p, watch=watch) for p in missing], deadline)
        if any(stat is not None for stat in stats):
            watch(None)  # created meanwhile: its children watch is not armed, so read again
    return [sorted(children or []) for children in found]
