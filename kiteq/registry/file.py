"""`file:///path/registry.json` — the registry for one machine, in one JSON file.

The same data as the ZooKeeper tree, shaped like it:

    {"servers":   {topic: [address, ...]},
     "producers": {topic: {group: [address, ...]}},
     "bindings":  {topic: {group: [binding JSON, ...]}}}

Several processes share the file: every change is a read-modify-write under an
exclusive `flock` on `<path>.lock`, written to a temporary file and renamed into
place, so readers never see half a file. Watchers poll (default every 0.5 s); there
are no ephemeral nodes, so a broker that crashed stays listed until it restarts or
is removed, and clients simply fail to connect to it and retry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import structlog
import trio

from kiteq.errors import RegistryError
from kiteq.registry.base import BindingsCallback, Registry, ServersCallback
from kiteq.registry.bindings import Binding, BindingError, merge_binding
from stores.uri import split_file_uri

Tree = dict[str, Any]


def _empty_tree() -> Tree:
    return {"servers": {}, "producers": {}, "bindings": {}}


log = structlog.get_logger(__name__)

CLOSE_TIMEOUT = 5.0
# Producer addresses kept per topic and group, newest first dropped last: a file has no
# sessions to expire them with, and producers killed without closing never withdraw.
MAX_PRODUCERS = 64


class FileRegistry(Registry):
    def __init__(self, path: Path, poll_interval: float = 0.5, uri: str = "") -> None:
        self.path = path
        self.poll_interval = poll_interval
        self.uri = uri or f"file://{path}"
        self._lock_path = path.with_name(path.name + ".lock")
        self._producers: list[tuple[str, str, tuple[str, ...]]] = []  # what this process registered

    @classmethod
    def from_uri(cls, uri: str) -> FileRegistry:
        try:
            path, options = split_file_uri(uri)
            poll = float(options.get("poll", "0.5"))
        except ValueError as exc:
            raise RegistryError(f"bad file registry URI: {exc}") from None
        return cls(path, poll, uri)

    @property
    def connected(self) -> bool:
        return True

    async def start(self) -> None:
        try:
            await trio.to_thread.run_sync(self._update, lambda tree: None)
        except OSError as exc:
            raise RegistryError(f"cannot open registry file {self.path}: {exc}") from None

    async def close(self) -> None:
        """Withdraw the producers this process registered (what ephemeral nodes do in ZooKeeper)."""
        registered, self._producers = self._producers, []
        if not registered:
            return

        def change(tree: Tree) -> None:
            for address, group, topics in registered:
                for topic in topics:
                    addresses = tree["producers"].get(topic, {}).get(group, [])
                    if address in addresses:
                        addresses.remove(address)

        with trio.move_on_after(CLOSE_TIMEOUT):
            try:
                await self._apply(change)
            except OSError as exc:
                log.warning("registry.withdraw_failed", path=str(self.path), error=str(exc))

    # -- file access (run in a worker thread) -------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> Tree:
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return _empty_tree()
        if not raw.strip():
            return _empty_tree()
        try:
            tree = json.loads(raw)
        except ValueError as exc:
            raise RegistryError(
                f"registry file {self.path} is not valid JSON ({exc}); fix or remove it"
            ) from None
        if not isinstance(tree, dict):
            raise RegistryError(f"registry file {self.path} must hold a JSON object; fix or remove it")
        base = _empty_tree()
        base.update(tree)
        return base

    def _update(self, change: Callable[[Tree], object]) -> object:
        with self._locked():
            tree = self._read()
            result = change(tree)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(tree, indent=2, sort_keys=True))
            os.replace(tmp, self.path)
            return result

    async def _apply(self, change: Callable[[Tree], object]) -> object:
        return await trio.to_thread.run_sync(self._update, change)

    async def _snapshot(self) -> Tree:
        return await trio.to_thread.run_sync(self._read)

    # -- servers and producers ----------------------------------------------------

    async def register_server(self, address: str, topics: Iterable[str]) -> None:
        wanted = set(topics)

        def change(tree: Tree) -> None:
            servers: dict[str, list[str]] = tree["servers"]
            for topic in set(servers) | wanted:
                addresses = [a for a in servers.get(topic, []) if a != address]
                if topic in wanted:
                    addresses.append(address)
                if addresses:
                    servers[topic] = sorted(addresses)
                else:
                    servers.pop(topic, None)

        await self._apply(change)

    async def unregister_server(self, address: str) -> None:
        await self.register_server(address, ())

    async def list_servers(self, topic: str | None = None) -> dict[str, list[str]]:
        servers: dict[str, list[str]] = (await self._snapshot())["servers"]
        return {t: a for t, a in servers.items() if topic is None or t == topic}

    async def register_producer(self, address: str, group: str, topics: Iterable[str]) -> None:
        wanted = tuple(topics)

        def change(tree: Tree) -> None:
            for topic in wanted:
                addresses = tree["producers"].setdefault(topic, {}).setdefault(group, [])
                if address not in addresses:
                    addresses.append(address)
                    del addresses[:-MAX_PRODUCERS]

        await self._apply(change)
        self._producers.append((address, group, wanted))

    async def list_producers(self) -> dict[str, dict[str, list[str]]]:
        return (await self._snapshot())["producers"]

    # -- bindings -----------------------------------------------------------------

    async def put_bindings(self, group: str, topic: str, bindings: list[Binding]) -> None:
        checked: list[Binding] = []
        for binding in bindings:
            checked = merge_binding(checked, binding.with_group(group))

        def change(tree: Tree) -> None:
            tree["bindings"].setdefault(topic, {})[group] = [b.to_json() for b in checked]

        await self._apply(change)

    async def add_binding(self, binding: Binding) -> None:
        def change(tree: Tree) -> None:
            groups = tree["bindings"].setdefault(binding.topic, {})
            current = [Binding.from_json(item) for item in groups.get(binding.group, [])]
            groups[binding.group] = [b.to_json() for b in merge_binding(current, binding)]

        await self._apply(change)

    async def remove_binding(self, group: str, topic: str, message_type: str | None = None) -> int:
        def change(tree: Tree) -> int:
            groups = tree["bindings"].get(topic, {})
            current = groups.get(group, [])
            kept = [
                item
                for item in current
                if message_type is not None and item.get("messageType") != message_type
            ]
            if kept:
                groups[group] = kept
            else:
                groups.pop(group, None)
            return len(current) - len(kept)

        removed = await self._apply(change)
        assert isinstance(removed, int)
        return removed

    async def list_bindings(self, topic: str | None = None, group: str | None = None) -> list[Binding]:
        return _bindings_of(await self._snapshot(), topic, group)

    # -- watches ------------------------------------------------------------------

    async def watch_bindings(
        self, on_change: BindingsCallback, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await self._watch(lambda tree: _bindings_of(tree, None, None), on_change, task_status)

    async def watch_servers(
        self,
        topic: str,
        on_change: ServersCallback,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await self._watch(lambda tree: list(tree["servers"].get(topic, [])), on_change, task_status)

    async def _watch(
        self,
        select: Callable[[Tree], Any],
        on_change: Callable[[Any], None],
        task_status: trio.TaskStatus[None],
    ) -> None:
        last = select(await self._snapshot())
        on_change(last)
        task_status.started()
        while True:
            await trio.sleep(self.poll_interval)
            try:
                current = select(await self._snapshot())
            except (RegistryError, BindingError, OSError):
                continue  # a broken edit: keep the last good value until it is fixed
            if current != last:
                last = current
                on_change(current)


def _bindings_of(tree: Tree, topic: str | None, group: str | None) -> list[Binding]:
    found: list[Binding] = []
    for t, groups in sorted(tree["bindings"].items()):
        if topic is not None and t != topic:
            continue
        for g, items in sorted(groups.items()):
            if group is None or g == group:
                found.extend(Binding.from_json(item) for item in items)
    return found
