"""The kazoo <-> Trio bridge: one kazoo client, used from Trio without ever blocking it.

kazoo runs its own threads (a connection thread and a callback thread) and the Trio
thread must never block on them, so:

* Every ZooKeeper operation is plain blocking kazoo code run in a worker thread
  (`Bridge.call`). Inside, requests are issued with the `*_async` calls and awaited
  with a deadline (`wait`, `gather`): a plain kazoo call blocks forever while the
  server is away. Independent requests are issued together and then awaited, so
  reading a whole subtree costs one round trip per level.
* Events come back through the `TrioToken` captured in `start()`:
  `token.run_sync_soon` never blocks kazoo's threads. A watch (ZooKeeper watches
  fire once) only sets a per-watcher wake-up; the watcher then re-reads the full
  value with fresh watches and calls `on_change` if it differs. Coalescing events
  this way cannot lose one: a change during a read re-arms the wake-up.

A state listener records kazoo's state (`connected`, `state`) and wakes every watcher.
While the connection is down watchers keep quiet; on every reconnect they re-read and
re-arm (kazoo drops its watch callbacks when the connection drops), and the
`on_reconnect` hook given to `start` runs in a kazoo-spawned thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import WatchedEvent
from structlog.typing import FilteringBoundLogger

from kiteq.errors import RegistryError

T = TypeVar("T")
Watch = Callable[[WatchedEvent | None], None]
# kazoo work for a worker thread: (client, deadline) -> result.
Work = Callable[[KazooClient, float], T]
# Blocking work on the session, in a worker or kazoo thread: see `Bridge.start` and `close`.
Hook = Callable[[KazooClient], None]

# One ZooKeeper request round trip is sub-millisecond on a LAN; 5 s only fires
# when the server is gone, and bounds how long a read waits before using the cache.
DEFAULT_OP_TIMEOUT = 5.0
# After a failed read while still connected (a slow or refusing server), try again.
WATCH_RETRY_INTERVAL = 1.0
CLOSED = "CLOSED"

# Errors that mean "ZooKeeper cannot be reached right now", as opposed to a refusal.
UNREACHABLE = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, KazooTimeoutError)


class ZooKeeperUnavailable(RegistryError):
    """ZooKeeper could not be reached in time; retry, or check the registry address."""


def wait(result: Any, deadline: float) -> Any:
    """The value of one kazoo async request, waiting no later than `deadline`."""
    return result.get(timeout=max(0.0, deadline - time.monotonic()))


def gather(results: list[Any], deadline: float) -> list[Any]:
    """Wait for requests issued together; a missing node gives None."""
    values = []
    for result in results:
        try:
            values.append(wait(result, deadline))
        except NoNodeError:
            values.append(None)
    return values


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


class Bridge:
    """One kazoo client seen from Trio: its session state, worker-thread calls and watches."""

    def __init__(self, hosts: str, *, op_timeout: float, log: FilteringBoundLogger) -> None:
        self.hosts = hosts
        self.op_timeout = op_timeout
        self.client: KazooClient | None = None
        self._log = log
        self._token: trio.lowlevel.TrioToken | None = None
        self._state = CLOSED
        self._on_reconnect: Hook | None = None
        self._wakeups: set[_Wakeup] = set()

    @property
    def connected(self) -> bool:
        return self._state == KazooState.CONNECTED

    @property
    def state(self) -> str:
        """kazoo's view of the session: CONNECTED, SUSPENDED, LOST, or CLOSED."""
        return str(self._state)

    def live_client(self) -> KazooClient:
        if self.client is None:
            raise RegistryError("the ZooKeeper registry is not started (or already closed)")
        return self.client

    # -- session ----------------------------------------------------------------------

    async def start(
        self, *, session_timeout: float, connect_timeout: float, on_reconnect: Hook
    ) -> KazooClient:
        """Open a session; `on_reconnect` then runs in a kazoo thread after every reconnect."""
        self._token = trio.lowlevel.current_trio_token()
        self._on_reconnect = on_reconnect
        client = KazooClient(
            hosts=self.hosts,
            timeout=session_timeout,
            # Reconnect forever, at least every 2 s, so an outage ends as soon as ZooKeeper is back.
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2.0},
        )
        client.add_listener(self._on_state)
        self.client = client
        try:
            await trio.to_thread.run_sync(client.start, connect_timeout)
        except KazooTimeoutError:
            self.client = None
            raise ZooKeeperUnavailable(
                f"cannot reach ZooKeeper at {self.hosts} within {connect_timeout:g} s: "
                "is it running, and is the registry address right?"
            ) from None
        return client

    async def close(self, before_stop: Hook) -> None:
        """Run `before_stop` in a worker thread while the session is still open, then end it."""
        client = self.client
        if client is None:
            return

        def shutdown() -> None:
            before_stop(client)
            client.remove_listener(self._on_state)
            client.stop()
            client.close()
            self._log.info("registry.closed")

        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(shutdown)
        self.client = None
        self._state = CLOSED
        self._wake_all()

    def _on_state(self, state: str) -> None:
        """kazoo's state listener, on its connection thread: record, wake, never block."""
        previous, self._state = self._state, state
        if state == KazooState.CONNECTED:
            self._log.info("registry.connected", previous=str(previous))
            if previous != CLOSED and self.client is not None:
                self.client.handler.spawn(self._reconnected)
        else:
            self._log.warning("registry.disconnected", state=str(state))
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._wake_all, idempotent=True)

    def _reconnected(self) -> None:
        """On a kazoo-spawned thread: hand the new session to the `on_reconnect` hook."""
        client = self.client
        if client is not None and self._on_reconnect is not None:
            self._on_reconnect(client)

    def _wake_all(self) -> None:
        for wakeup in self._wakeups:
            wakeup.set()

    # -- work off the Trio thread -------------------------------------------------------

    async def call(self, work: Work[T], *, read: bool = False, offline_ok: bool = False) -> T:
        """Run `work(client, deadline)` in a worker thread; kazoo's errors become RegistryErrors.

        While disconnected this fails at once unless `offline_ok`: kazoo would queue
        the request and send it on reconnect, so a write reported as failed could
        still happen later. Reads may be abandoned on cancellation (their result
        is just dropped); writes are waited for, bounded by `op_timeout` anyway.
        """
        self.live_client()
        if not (offline_ok or self.connected):
            raise ZooKeeperUnavailable(
                f"ZooKeeper at {self.hosts} is unreachable right now ({self.state}); retry when it is back"
            )
        try:
            return await trio.to_thread.run_sync(
                lambda: work(self.live_client(), time.monotonic() + self.op_timeout), abandon_on_cancel=read
            )
        except UNREACHABLE as exc:
            raise ZooKeeperUnavailable(
                f"ZooKeeper at {self.hosts} did not answer ({type(exc).__name__}); it may be down or unreachable"
            ) from None
        except KazooException as exc:
            raise RegistryError(f"ZooKeeper at {self.hosts} refused the request: {exc!r}") from None

    async def watch(
        self,
        what: str,
        read: Callable[[KazooClient, float, Watch], T],
        on_change: Callable[[T], None],
        task_status: trio.TaskStatus[None],
    ) -> None:
        """Read with watches armed, hand on a changed value, sleep until woken; repeat.

        Woken by a ZooKeeper watch, by any session state change, or after a failed
        read. While disconnected nothing is read and `on_change` is not called: the
        caller keeps its last value. If ZooKeeper is away when the watch starts,
        `task_status.started()` is still called and the first value comes on reconnect.
        """
        self.live_client()
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
                        value = await self.call(
                            lambda client, deadline: read(client, deadline, wakeup.notify), read=True
                        )
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
