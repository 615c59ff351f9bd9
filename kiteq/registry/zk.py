"""`zk://h1:2181,h2:2181[/chroot][?session_timeout=10]` — the registry in ZooKeeper.

KiteQ's tree, so KiteQ's tooling reads ours (docs/registry.md):

    /kiteq/server/{topic}/{host:port}        ephemeral, brokers
    /kiteq/pub/{topic}/{group}/{host:port}   ephemeral, producers
    /kiteq/sub/{topic}/{group}-bind          persistent, JSON list of bindings

The kazoo <-> Trio bridge. kazoo runs its own threads (a connection thread and a
callback thread) and the Trio thread must never block on them, so:

* Every ZooKeeper operation is plain blocking kazoo code run in a worker thread
  (`trio.to_thread.run_sync`). Inside, requests are issued with the `*_async` calls
  and awaited with a deadline (`op_timeout`): a plain kazoo call blocks forever
  while the server is away. Independent requests are issued together and then
  awaited, so reading a whole subtree costs one round trip per level.
* Events come back through the `TrioToken` captured in `start()`:
  `token.run_sync_soon` never blocks kazoo's threads. A watch (ZooKeeper watches
  fire once) only sets a per-watcher wake-up; the watcher then re-reads the full
  value with fresh watches and calls `on_change` if it differs. Coalescing events
  this way cannot lose one: a change during a read re-arms the wake-up.

Sessions. A state listener records kazoo's state (`connected`, `state`). While the
connection is down watchers keep quiet and reads answer from the last value read.
On every reconnect watchers re-read and re-arm (kazoo drops its watch callbacks
when the connection drops), and this process's ephemeral nodes are reconciled in a
kazoo-spawned thread: after a session expiry (LOST) ZooKeeper deleted them, and
they are created again under the new session without a restart. The desired set
of ephemeral nodes is kept here, guarded by a threading lock, so a registration
made while ZooKeeper is away is applied when it returns.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import structlog
import trio
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import WatchedEvent

from kiteq.errors import RegistryError
from kiteq.registry.base import BindingsCallback, Registry, ServersCallback
from kiteq.registry.bindings import Binding, BindingError, decode_bindings, encode_bindings, merge_binding

log = structlog.get_logger(__name__)

T = TypeVar("T")
Watch = Callable[[WatchedEvent | None], None]

DEFAULT_PORT = 2181
DEFAULT_SESSION_TIMEOUT = 10.0
DEFAULT_CONNECT_TIMEOUT = 10.0
# One ZooKeeper request round trip is sub-millisecond on a LAN; 5 s only fires
# when the server is gone, and bounds how long a read waits before using the cache.
DEFAULT_OP_TIMEOUT = 5.0
# After a failed read while still connected (a slow or refusing server), try again.
WATCH_RETRY_INTERVAL = 1.0
BIND_SUFFIX = "-bind"
CLOSED = "CLOSED"
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]/]+)(?::(\d+))?")  # host, [v6] or either with :port

# Errors that mean "ZooKeeper cannot be reached right now", as opposed to a refusal.
_UNREACHABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, KazooTimeoutError)


class ZooKeeperUnavailable(RegistryError):
    """ZooKeeper could not be reached in time; retry, or check the registry address."""


def parse_zk_uri(uri: str) -> tuple[str, str, dict[str, float]]:
    """`zk://h1:2181,h2/chroot?session_timeout=10` -> ("h1:2181,h2:2181", "/chroot", {...})."""
    parts = urlsplit(uri)
    if parts.scheme != "zk" or not parts.netloc:
        raise RegistryError(f"bad ZooKeeper URI {uri!r}: use zk://host:2181[,host:2181][/chroot]")
    hosts = []
    for item in parts.netloc.split(","):
        match = _HOST_PORT.fullmatch(item.strip())
        port = int(match.group(2) or DEFAULT_PORT) if match else 0
        if match is None or not 0 < port < 65536:
            raise RegistryError(f"bad ZooKeeper address {item!r} in {uri!r}: use host:port")
        hosts.append(f"{match.group(1)}:{port}")
    chroot = parts.path.rstrip("/")
    if chroot and any(not part for part in chroot.split("/")[1:]):
        raise RegistryError(f"bad ZooKeeper chroot {parts.path!r} in {uri!r}: use /name[/name…]")
    options: dict[str, float] = {}
    for key, values in parse_qs(parts.query).items():
        if key not in ("session_timeout", "connect_timeout"):
            raise RegistryError(f"unknown option {key!r} in {uri!r}: use session_timeout or connect_timeout")
        try:
            options[key] = float(values[-1])
        except ValueError:
            raise RegistryError(f"option {key!r} in {uri!r} must be a number of seconds") from None
        if options[key] <= 0:
            raise RegistryError(f"option {key!r} in {uri!r} must be positive")
    return ",".join(hosts), chroot, options


def _name(kind: str, value: str) -> str:
    """A node name from a topic, group or address: one path component."""
    if not value or "/" in value or value in (".", ".."):
        raise RegistryError(f"invalid {kind} {value!r} for ZooKeeper: it must be non-empty and have no '/'")
    return value


class _Wakeup:
    """A level-triggered wake-up for one watcher, set from any thread.

    `notify` is the kazoo watch callback: it only schedules `set` on the Trio
    thread (never blocks kazoo). The same bound method is passed to every read,
    so kazoo keeps one callback per path however often the watcher re-reads.
    """

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._event = trio.Event()

    def notify(self, _event: WatchedEvent | None = None) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the run is over: nobody is watching
            self._token.run_sync_soon(self.set, idempotent=True)

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = trio.Event()

    async def wait(self, timeout: float = float("inf")) -> None:
        with trio.move_on_after(timeout):
            await self._event.wait()


class ZooKeeperRegistry(Registry):
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
        self.op_timeout = op_timeout
        self.uri = uri or f"zk://{hosts}{chroot}"
        self._root = f"{chroot}/kiteq"
        self._client: KazooClient | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._state = CLOSED
        self._wakeups: set[_Wakeup] = set()
        self._cache: dict[tuple[object, ...], Any] = {}
        # Desired ephemeral nodes, the ones to withdraw, and who registered what;
        # touched by worker threads and kazoo-spawned threads, under this lock.
        self._lock = threading.Lock()
        self._ephemerals: set[str] = set()
        self._withdrawn: set[str] = set()
        self._server_topics: dict[str, set[str]] = {}
        self._log = log.bind(registry=self.uri)

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
        return self._state == KazooState.CONNECTED

    @property
    def state(self) -> str:
        """kazoo's view of the session: CONNECTED, SUSPENDED, LOST, or CLOSED (for stats)."""
        return str(self._state)

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """The ZooKeeper session (id, password); for diagnostics and session-expiry tests."""
        return self._client.client_id if self._client is not None else None

    def _on_state(self, state: str) -> None:
        """kazoo's state listener, on its connection thread: record, wake, never block."""
        previous, self._state = self._state, state
        if state == KazooState.CONNECTED:
            self._log.info("registry.connected", previous=str(previous))
            if previous != CLOSED and self._client is not None:
                self._client.handler.spawn(self._reconcile_after_reconnect)
        else:
            self._log.warning("registry.disconnected", state=str(state))
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._wake_all, idempotent=True)

    def _wake_all(self) -> None:
        for wakeup in self._wakeups:
            wakeup.set()

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        client = KazooClient(
            hosts=self.hosts,
            timeout=self.session_timeout,
            # Reconnect forever, at least every 2 s, so an outage ends as soon as ZooKeeper is back.
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2.0},
        )
        client.add_listener(self._on_state)
        self._client = client
        try:
            await trio.to_thread.run_sync(client.start, self.connect_timeout)
        except KazooTimeoutError:
            self._client = None
            raise ZooKeeperUnavailable(
                f"cannot reach ZooKeeper at {self.hosts} within {self.connect_timeout:g} s: "
                "is it running, and is the registry address right?"
            ) from None
        try:
            await self._call(lambda deadline: self._wait(client.ensure_path_async(self._root), deadline))
        except BaseException:
            await self.close()
            raise
        self._log.info("registry.started", session=f"{client.client_id[0]:#x}")

    async def close(self) -> None:
        client = self._client
        if client is None:
            return
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._shutdown, client)
        self._client = None
        self._state = CLOSED
        self._wake_all()

    def _shutdown(self, client: KazooClient) -> None:
        """Withdraw our ephemeral nodes now (not at session timeout) and stop kazoo."""
        with self._lock:
            self._withdrawn |= self._ephemerals
            self._ephemerals.clear()
            self._server_topics.clear()
            if self.connected:
                try:
                    self._reconcile_locked(client, time.monotonic() + self.op_timeout)
                except (*_UNREACHABLE, KazooException) as exc:
                    self._log.warning("registry.withdraw_failed", error=repr(exc))
        client.remove_listener(self._on_state)
        client.stop()
        client.close()
        self._log.info("registry.closed")

    # -- running kazoo work off the Trio thread -----------------------------------------

    def _live_client(self) -> KazooClient:
        if self._client is None:
            raise RegistryError("the ZooKeeper registry is not started (or already closed)")
        return self._client

    async def _call(self, work: Callable[[float], T], *, read: bool = False, offline_ok: bool = False) -> T:
        """Run `work(deadline)` in a worker thread; kazoo's errors become RegistryErrors.

        While disconnected this fails at once unless `offline_ok`: kazoo would queue
        the request and send it on reconnect, so a write reported as failed could
        still happen later. Reads may be abandoned on cancellation (their result
        is just dropped); writes are waited for, bounded by `op_timeout` anyway.
        """
        self._live_client()
        if not (offline_ok or self.connected):
            raise ZooKeeperUnavailable(
                f"ZooKeeper at {self.hosts} is unreachable right now ({self.state}); retry when it is back"
            )
        try:
            return await trio.to_thread.run_sync(
                lambda: work(time.monotonic() + self.op_timeout), abandon_on_cancel=read
            )
        except _UNREACHABLE as exc:
            raise ZooKeeperUnavailable(
                f"ZooKeeper at {self.hosts} did not answer ({type(exc).__name__}); it may be down or unreachable"
            ) from None
        except KazooException as exc:
            raise RegistryError(f"ZooKeeper at {self.hosts} refused the request: {exc!r}") from None

    async def _read(self, key: tuple[object, ...], work: Callable[[float], T]) -> T:
        """A read that answers from the last value read while ZooKeeper is away."""
        if not self.connected and key in self._cache:
            return self._cache[key]
        try:
            value = await self._call(work, read=True)
        except ZooKeeperUnavailable:
            if key in self._cache:
                self._log.warning("registry.stale_read", what=key[0])
                return self._cache[key]
            raise
        self._cache[key] = value
        return value

    @staticmethod
    def _wait(result: Any, deadline: float) -> Any:
        return result.get(timeout=max(0.0, deadline - time.monotonic()))

    def _gather(self, results: list[Any], deadline: float) -> list[Any]:
        """Wait for requests issued together; a missing node gives None."""
        values = []
        for result in results:
            try:
                values.append(self._wait(result, deadline))
            except NoNodeError:
                values.append(None)
        return values

    def _children(self, paths: list[str], deadline: float, watch: Watch | None = None) -> list[list[str]]:
        """Children of each path ([] for a missing one; its creation is watched)."""
        client = self._live_client()
        found = self._gather([client.get_children_async(p, watch=watch) for p in paths], deadline)
        missing = [p for p, children in zip(paths, found, strict=True) if children is None]
        if watch is not None and missing:
            stats = self._gather([client.exists_async(p, watch=watch) for p in missing], deadline)
            if any(stat is not None for stat in stats):
                watch(None)  # created meanwhile: its children watch is not armed, so read again
        return [sorted(children or []) for children in found]

    # -- paths ----------------------------------------------------------------------

    def _server_path(self, topic: str, address: str) -> str:
        return f"{self._root}/server/{_name('topic', topic)}/{_name('address', address)}"

    def _producer_path(self, topic: str, group: str, address: str) -> str:
        return f"{self._root}/pub/{_name('topic', topic)}/{_name('group', group)}/{_name('address', address)}"

    def _bind_path(self, topic: str, group: str) -> str:
        return f"{self._root}/sub/{_name('topic', topic)}/{_name('group', group)}{BIND_SUFFIX}"

    # -- ephemeral nodes ---------------------------------------------------------------

    def _update_ephemerals(self, add: set[str], remove: set[str], deadline: float) -> None:
        """Change the desired ephemeral nodes and apply; while ZooKeeper is away, apply on reconnect."""
        with self._lock:
            self._ephemerals = (self._ephemerals - remove) | add
            self._withdrawn = (self._withdrawn | remove) - self._ephemerals
            if not self.connected:
                self._log.warning("registry.registration_deferred", added=len(add), removed=len(remove))
                return
            try:
                self._reconcile_locked(self._live_client(), deadline)
            except _UNREACHABLE as exc:
                self._log.warning("registry.registration_deferred", error=type(exc).__name__)

    def _reconcile_after_reconnect(self) -> None:
        """On a kazoo-spawned thread after a reconnect: re-create what a lost session took."""
        client = self._client
        if client is None:
            return
        with self._lock:
            try:
                count = self._reconcile_locked(client, time.monotonic() + self.op_timeout)
            except (*_UNREACHABLE, KazooException) as exc:
                self._log.warning("registry.reregister_failed", error=repr(exc))
                return
        if count:
            self._log.info("registry.reregistered", nodes=count)

    def _reconcile_locked(self, client: KazooClient, deadline: float) -> int:
        """Make ZooKeeper hold exactly our desired ephemeral nodes; the number (re)created.

        A node left by another session (our own previous run, not yet expired) is
        replaced, as KiteQ does, or it would vanish when that session expires.
        """
        session = client.client_id[0] if client.client_id else None
        withdrawn = sorted(self._withdrawn)
        for path, stat in zip(
            withdrawn, self._gather([client.exists_async(p) for p in withdrawn], deadline), strict=True
        ):
            if stat is not None and stat.ephemeralOwner == session:
                with contextlib.suppress(NoNodeError):
                    self._wait(client.delete_async(path), deadline)
            self._withdrawn.discard(path)
        wanted = sorted(self._ephemerals)
        created = 0
        for path, stat in zip(
            wanted, self._gather([client.exists_async(p) for p in wanted], deadline), strict=True
        ):
            if stat is not None and stat.ephemeralOwner == session:
                continue
            if stat is not None:
                with contextlib.suppress(NoNodeError):
                    self._wait(client.delete_async(path), deadline)
            self._wait(client.create_async(path, b"", ephemeral=True, makepath=True), deadline)
            created += 1
        return created

    # -- servers and producers ----------------------------------------------------------

    async def register_server(self, address: str, topics: Iterable[str]) -> None:
        wanted = {_name("topic", t) for t in topics}
        _name("address", address)

        def work(deadline: float) -> None:
            with self._lock:
                previous = self._server_topics.get(address, set())
                if wanted:
                    self._server_topics[address] = wanted
                else:
                    self._server_topics.pop(address, None)
            self._update_ephemerals(
                {self._server_path(t, address) for t in wanted},
                {self._server_path(t, address) for t in previous - wanted},
                deadline,
            )

        await self._call(work, offline_ok=True)

    async def unregister_server(self, address: str) -> None:
        """Withdraw a broker this process registered (others' nodes go with their sessions).

        After `close()` this does nothing: closing already withdrew every node.
        """
        if self._client is None:
            return
        await self.register_server(address, ())

    async def list_servers(self, topic: str | None = None) -> dict[str, list[str]]:
        return await self._read(("servers", topic), lambda deadline: self._read_servers(topic, deadline))

    def _read_servers(
        self, topic: str | None, deadline: float, watch: Watch | None = None
    ) -> dict[str, list[str]]:
        base = f"{self._root}/server"
        topics = [_name("topic", topic)] if topic is not None else self._children([base], deadline, watch)[0]
        addresses = self._children([f"{base}/{t}" for t in topics], deadline, watch)
        return {t: a for t, a in zip(topics, addresses, strict=True) if a}

    async def register_producer(self, address: str, group: str, topics: Iterable[str]) -> None:
        paths = {self._producer_path(t, group, address) for t in topics}
        await self._call(lambda deadline: self._update_ephemerals(paths, set(), deadline), offline_ok=True)

    async def list_producers(self) -> dict[str, dict[str, list[str]]]:
        return await self._read(("producers",), self._read_producers)

    def _read_producers(self, deadline: float) -> dict[str, dict[str, list[str]]]:
        base = f"{self._root}/pub"
        topics = self._children([base], deadline)[0]
        groups = self._children([f"{base}/{t}" for t in topics], deadline)
        pairs = [(t, g) for t, gs in zip(topics, groups, strict=True) for g in gs]
        addresses = self._children([f"{base}/{t}/{g}" for t, g in pairs], deadline)
        found: dict[str, dict[str, list[str]]] = {}
        for (t, g), a in zip(pairs, addresses, strict=True):
            if a:
                found.setdefault(t, {})[g] = a
        return found

    # -- bindings -------------------------------------------------------------------

    async def put_bindings(self, group: str, topic: str, bindings: list[Binding]) -> None:
        checked: list[Binding] = []
        for binding in bindings:
            checked = merge_binding(checked, binding.with_group(group))
        path = self._bind_path(topic, group)

        def work(deadline: float) -> None:
            client = self._live_client()
            if not checked:
                with contextlib.suppress(NoNodeError):
                    self._wait(client.delete_async(path), deadline)
                return
            data = encode_bindings(checked)
            try:
                self._wait(client.set_async(path, data), deadline)
            except NoNodeError:
                try:
                    self._wait(client.create_async(path, data, makepath=True), deadline)
                except NodeExistsError:
                    self._wait(client.set_async(path, data), deadline)

        await self._call(work)

    async def add_binding(self, binding: Binding) -> None:
        path = self._bind_path(binding.topic, binding.group)

        def work(deadline: float) -> None:
            client = self._live_client()
            while True:  # compare-and-set: a concurrent writer makes us read again
                try:
                    data, stat = self._wait(client.get_async(path), deadline)
                except NoNodeError:
                    try:
                        self._wait(
                            client.create_async(path, encode_bindings([binding]), makepath=True), deadline
                        )
                        return
                    except NodeExistsError:
                        continue
                merged = merge_binding(decode_bindings(data), binding)
                try:
                    self._wait(
                        client.set_async(path, encode_bindings(merged), version=stat.version), deadline
                    )
                    return
                except (BadVersionError, NoNodeError):
                    continue

        await self._call(work)

    async def remove_binding(self, group: str, topic: str, message_type: str | None = None) -> int:
        path = self._bind_path(topic, group)

        def work(deadline: float) -> int:
            client = self._live_client()
            while True:  # compare-and-set, as in add_binding
                try:
                    data, stat = self._wait(client.get_async(path), deadline)
                except NoNodeError:
                    return 0
                current = decode_bindings(data)
                kept = [b for b in current if message_type is not None and b.message_type != message_type]
                if current and len(kept) == len(current):
                    return 0
                try:
                    if kept:
                        self._wait(
                            client.set_async(path, encode_bindings(kept), version=stat.version), deadline
                        )
                    else:
                        self._wait(client.delete_async(path, version=stat.version), deadline)
                    return len(current) - len(kept)
                except (BadVersionError, NoNodeError, NotEmptyError):
                    continue

        return await self._call(work)

    async def list_bindings(self, topic: str | None = None, group: str | None = None) -> list[Binding]:
        return await self._read(
            ("bindings", topic, group), lambda deadline: self._read_bindings(deadline, topic, group)
        )

    def _read_bindings(
        self, deadline: float, topic: str | None = None, group: str | None = None, watch: Watch | None = None
    ) -> list[Binding]:
        """Every binding (of a topic, of a group): the whole subtree, re-read in full.

        Reading everything after any event is what keeps a deleted node of one
        group from dropping the other groups' bindings (KiteQ's bug).
        """
        client = self._live_client()
        base = f"{self._root}/sub"
        topics = [_name("topic", topic)] if topic is not None else self._children([base], deadline, watch)[0]
        if group is not None:
            nodes = [self._bind_path(t, group) for t in topics]
        else:
            children = self._children([f"{base}/{t}" for t in topics], deadline, watch)
            nodes = [
                f"{base}/{t}/{node}"
                for t, names in zip(topics, children, strict=True)
                for node in names
                if node.endswith(BIND_SUFFIX)
            ]
        found: list[Binding] = []
        for node, value in zip(
            nodes, self._gather([client.get_async(n, watch=watch) for n in nodes], deadline), strict=True
        ):
            if value is None:
                continue
            try:
                found.extend(decode_bindings(value[0]))
            except BindingError as exc:
                self._log.warning("registry.bad_binding_node", node=node, error=str(exc))
        return found

    # -- watches ------------------------------------------------------------------

    async def watch_bindings(
        self, on_change: BindingsCallback, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await self._watch(
            "bindings",
            lambda deadline, watch: self._read_bindings(deadline, watch=watch),
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
        _name("topic", topic)
        await self._watch(
            f"servers:{topic}",
            lambda deadline, watch: self._read_servers(topic, deadline, watch).get(topic, []),
            on_change,
            task_status,
        )

    async def _watch(
        self,
        what: str,
        read: Callable[[float, Watch], T],
        on_change: Callable[[T], None],
        task_status: trio.TaskStatus[None],
    ) -> None:
        """Read with watches armed, hand on a changed value, sleep until woken; repeat.

        Woken by a ZooKeeper watch, by any session state change, or after a failed
        read. While disconnected nothing is read and `on_change` is not called: the
        caller keeps its last value. If ZooKeeper is away when the watch starts,
        `task_status.started()` is still called and the first value comes on reconnect.
        """
        self._live_client()
        assert self._token is not None
        wakeup = _Wakeup(self._token)
        self._wakeups.add(wakeup)
        watch_log = self._log.bind(watch=what)
        started = False
        last: Any = None
        have_value = False
        try:
            while True:
                wakeup.clear()
                retry = float("inf")
                if self.connected:
                    try:
                        value = await self._call(lambda deadline: read(deadline, wakeup.notify), read=True)
                    except RegistryError as exc:
                        watch_log.warning("registry.watch_read_failed", error=str(exc))
                        retry = WATCH_RETRY_INTERVAL
                    else:
                        if not have_value or value != last:
                            last, have_value = value, True
                            on_change(value)
                if not started:
                    task_status.started()
                    started = True
                await wakeup.wait(retry)
        finally:
            self._wakeups.discard(wakeup)
