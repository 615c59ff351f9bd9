"""`file:///path/registry.json` — the registry for one machine, in one JSON file.

The same data as the ZooKeeper tree, shaped like it (`file_tree` has the layout and
the rules). Several processes share the file: every change is a read-modify-write
under an exclusive `flock` on `<path>.lock`, written to a temporary file and renamed
into place, so readers never see half a file. Watchers poll (`?poll=`, default every
0.5 s). Brokers, their admin endpoints and producers stand in for ZooKeeper's
ephemeral nodes with heartbeats: each process rewrites its own every `ttl / 3`
seconds (`?ttl=`, default 30 s) and withdraws its entries when it closes; readers
ignore, and writers prune, whatever stopped heartbeating for a TTL, so a process
killed with SIGKILL drops out of `servers`, `admins` and `producers` within `ttl`
seconds.

A registry made with `create=False` (what `kiteq-admin` does unless `--create`)
refuses a file that does not exist instead of starting an empty one: a misspelt path
is an error, not an empty registry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import structlog
import trio

from kiteq.errors import RegistryError
from kiteq.registry.base import BindingsCallback, Registry, ServersCallback
from kiteq.registry.bindings import Binding, BindingError, merge_binding
from kiteq.registry.file_tree import (
    Tree,
    beat,
    empty_tree,
    forget,
    prune,
    put_admin,
    put_producer,
    put_server,
    withdraw_admin,
    withdraw_producer,
)
from stores.uri import split_file_uri

log = structlog.get_logger(__name__)

CLOSE_TIMEOUT = 5.0


class RegistryMissing(RegistryError):
    """The registry file to read does not exist (and the registry may not create it)."""


@dataclass(frozen=True, slots=True)
class FileRegistryOptions:
    """What a file registry URI's query sets: `file:///path/registry.json?poll=0.5&ttl=30`."""

    poll: float = 0.5  # seconds between a watcher's reads of the file
    # Seconds a broker or producer stays listed after its last heartbeat: long enough
    # that a busy machine (or a paused debugger) does not drop live processes, short
    # enough that `kiteq-admin producers` forgets killed ones within half a minute.
    ttl: float = 30.0

    @property
    def refresh(self) -> float:
        """Seconds between heartbeats: three per TTL, so one late write expires nobody."""
        return self.ttl / 3

    @classmethod
    def from_query(cls, query: dict[str, str]) -> FileRegistryOptions:
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(query) - known)
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        values: dict[str, float] = {}
        for name, text in query.items():
            try:
                values[name] = float(text)
            except ValueError:
                raise ValueError(f"{name}={text!r} is not a number of seconds") from None
            if not values[name] > 0:
                raise ValueError(f"{name}={text!r} must be positive")
        return cls(**values)


class FileRegistry(Registry):
    """The registry in one JSON file; `clock` (unix seconds) dates heartbeats and judges them."""

    def __init__(
        self,
        path: Path,
        options: FileRegistryOptions | None = None,
        uri: str = "",
        *,
        create: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.options = options or FileRegistryOptions()
        self.uri = uri or f"file://{path}"
        self.create = create  # may be changed before `start`
        self.clock = clock
        self._lock_path = path.with_name(path.name + ".lock")
        # What this process registered, re-written with every heartbeat and withdrawn on close.
        self._servers: dict[str, tuple[str, ...]] = {}
        self._admins: dict[str, str] = {}
        self._producers: list[tuple[str, str, tuple[str, ...]]] = []
        self._writing = trio.Lock()
        self._tasks: contextlib.AsyncExitStack | None = None

    @classmethod
    def from_uri(cls, uri: str) -> FileRegistry:
        try:
            path, query = split_file_uri(uri)
            options = FileRegistryOptions.from_query(query)
        except ValueError as exc:
            raise RegistryError(f"bad file registry URI {uri!r}: {exc}") from None
        return cls(path, options, uri)

    @property
    def poll_interval(self) -> float:
        return self.options.poll

    @property
    def connected(self) -> bool:
        return True

    async def start(self) -> None:
        """Open (or with `create`, make) the file, then heartbeat in a nursery of our own until `close`."""
        try:
            if self.create:
                await self._apply(lambda tree: None)
            elif not await trio.to_thread.run_sync(self.path.is_file):
                raise RegistryMissing(
                    f"registry file {self.path} does not exist: check the path (a typo?), or create it"
                )
            else:
                await self._snapshot()  # a broken file is an error now, not at the first read
        except OSError as exc:
            raise RegistryError(f"cannot open registry file {self.path}: {exc}") from None
        tasks = contextlib.AsyncExitStack()
        nursery = await tasks.enter_async_context(trio.open_nursery())
        nursery.start_soon(self._keep_alive)
        tasks.callback(nursery.cancel_scope.cancel)  # runs before the nursery waits for its task
        self._tasks = tasks

    async def close(self) -> None:
        """Stop heartbeating and withdraw what this process registered (as ephemeral nodes go)."""
        if self._tasks is not None:
            tasks, self._tasks = self._tasks, None
            await tasks.aclose()
        addresses = self._addresses()
        servers, self._servers = self._servers, {}
        admins, self._admins = self._admins, {}
        producers, self._producers = self._producers, []
        if not addresses:
            return

        def change(tree: Tree) -> None:
            for address in servers:
                put_server(tree, address, ())
            for address in admins:
                withdraw_admin(tree, address)
            for address, group, topics in producers:
                withdraw_producer(tree, address, group, topics)
            forget(tree, addresses)

        with trio.move_on_after(CLOSE_TIMEOUT):
            try:
                await self._apply(change)
            except OSError as exc:
                log.warning("registry.withdraw_failed", path=str(self.path), error=str(exc))

    async def _keep_alive(self) -> None:
        """Every `refresh` seconds, re-write this process's entries with a fresh heartbeat.

        Re-writing, not only beating, puts back entries that expired while this
        process could not write (a stopped machine, a full disk) once it can again.
        """
        while True:
            await trio.sleep(self.options.refresh)
            if not self._addresses():
                continue
            try:
                await self._apply(self._reregister)
            except (OSError, RegistryError) as exc:
                log.warning("registry.heartbeat_failed", path=str(self.path), error=str(exc))

    def _reregister(self, tree: Tree) -> None:
        # Runs in a worker thread while `_writing` is held: registrations cannot change meanwhile.
        for address, topics in self._servers.items():
            put_server(tree, address, topics)
        for address, url in self._admins.items():
            put_admin(tree, address, url)
        for address, group, topics in self._producers:
            put_producer(tree, address, group, topics)
        beat(tree, self._addresses(), self.clock())

    def _addresses(self) -> list[str]:
        """Every address this process registered something under: the ones it heartbeats."""
        return list(dict.fromkeys([*self._servers, *self._admins, *(a for a, _, _ in self._producers)]))

    # -- file access (run in a worker thread) -------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> Tree:
        """The file as written, expired entries included; `{}` sections where it has none."""
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return empty_tree()
        if not raw.strip():
            return empty_tree()
        try:
            tree = json.loads(raw)
        except ValueError as exc:
            raise RegistryError(
                f"registry file {self.path} is not valid JSON ({exc}); fix or remove it"
            ) from None
        if not isinstance(tree, dict):
            raise RegistryError(f"registry file {self.path} must hold a JSON object; fix or remove it")
        base = empty_tree()
        base.update(tree)
        return base

    def _update(self, change: Callable[[Tree], object]) -> object:
        with self._locked():
            tree = self._read()
            result = change(tree)
            prune(tree, self.clock(), self.options.ttl)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(tree, indent=2, sort_keys=True))
            os.replace(tmp, self.path)
            return result

    async def _apply(self, change: Callable[[Tree], object]) -> object:
        async with self._writing:
            return await trio.to_thread.run_sync(self._update, change)

    async def _snapshot(self) -> Tree:
        """The live view: what the file holds, less the entries whose heartbeat expired."""
        tree = await trio.to_thread.run_sync(self._read)
        return prune(tree, self.clock(), self.options.ttl)

    # -- servers and producers ----------------------------------------------------

    async def register_server(self, address: str, topics: Iterable[str]) -> None:
        wanted = tuple(topics)

        def change(tree: Tree) -> None:
            put_server(tree, address, wanted)
            if wanted:
                beat(tree, [address], self.clock())
            elif address not in self._admins:  # its admin endpoint, still registered, lives on
                forget(tree, [address])

        await self._apply(change)
        if wanted:
            self._servers[address] = wanted
        else:
            self._servers.pop(address, None)

    async def unregister_server(self, address: str) -> None:
        await self.register_server(address, ())

    async def list_servers(self, topic: str | None = None) -> dict[str, list[str]]:
        servers: dict[str, list[str]] = (await self._snapshot())["servers"]
        return {t: a for t, a in servers.items() if topic is None or t == topic}

    async def register_admin(self, address: str, url: str) -> None:
        def change(tree: Tree) -> None:
            put_admin(tree, address, url)
            beat(tree, [address], self.clock())

        await self._apply(change)
        self._admins[address] = url

    async def list_admins(self) -> dict[str, str]:
        admins: dict[str, str] = (await self._snapshot())["admins"]
        return admins

    async def register_producer(self, address: str, group: str, topics: Iterable[str]) -> None:
        wanted = tuple(topics)

        def change(tree: Tree) -> None:
            put_producer(tree, address, group, wanted)
            beat(tree, [address], self.clock())

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
