"""The one place where asyncio meets Trio: a trio-asyncio loop owned by the store.

Why a system task: the store is opened and closed by two separate calls (`start`,
`close`), possibly from different tasks, so it cannot wrap its callers in
`trio_asyncio.open_loop()`, and nothing outside `stores/mysql` should have to run
inside one. `open()` therefore spawns a Trio system task that enters `open_loop()` and
a nursery and holds both until `close()`. aiomysql coroutines run on that loop through
`run()`; the store's background Trio tasks (batch flushers) run in that nursery through
`start_soon()`, so they live exactly as long as the loop they depend on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import structlog
import trio
import trio_asyncio

from stores.errors import StoreUnavailable

R = TypeVar("R")


class AsyncioBridge:
    """An asyncio event loop on top of Trio, alive from `open()` until `close()`."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._log = structlog.get_logger(__name__).bind(bridge=name)
        self._loop: trio_asyncio.TrioEventLoop | None = None
        self._nursery: trio.Nursery | None = None
        self._close_requested = trio.Event()
        self._stopped = trio.Event()
        self._opened = False
        self._error: BaseException | None = None

    async def open(self) -> None:
        """Start the loop; returns once asyncio code can run on it."""
        if self._opened:
            raise RuntimeError("an AsyncioBridge opens only once")
        self._opened = True
        ready = trio.Event()
        trio.lowlevel.spawn_system_task(self._hold_loop, ready, name=f"stores.mysql bridge {self._name}")
        try:
            await ready.wait()
        except BaseException:
            await self.close()
            raise
        if self._loop is None:
            raise StoreUnavailable(f"could not start the asyncio loop of the MySQL store: {self._error!r}")

    async def _hold_loop(self, ready: trio.Event) -> None:
        try:
            async with trio_asyncio.open_loop() as loop, trio.open_nursery() as nursery:
                self._loop, self._nursery = loop, nursery
                ready.set()
                await self._close_requested.wait()
                nursery.cancel_scope.cancel()
        except Exception as exc:
            # A system task must not raise (Trio would crash the whole run): record it,
            # and every later call fails with StoreUnavailable instead.
            self._error = exc
            self._log.error("mysql.bridge.crashed", exc_info=exc)
        finally:
            self._loop = self._nursery = None
            ready.set()
            self._stopped.set()

    async def run(self, fn: Callable[..., Coroutine[Any, Any, R]], *args: object) -> R:
        """Run the asyncio coroutine function `fn(*args)` on the loop; cancellable.

        Cancelling the calling Trio scope cancels the asyncio task and waits until it
        has finished unwinding, so a connection it used is never left mid-query.
        """
        loop = self._loop
        if loop is None:
            raise StoreUnavailable(f"the MySQL store is not running ({self._error or 'closed'})")
        result: R = await loop.run_aio_coroutine(fn(*args))
        return result

    def start_soon(
        self, fn: Callable[..., Awaitable[object]], *args: object, name: str | None = None
    ) -> None:
        """Run a Trio task for as long as the loop lives; it is cancelled at `close()`."""
        if self._nursery is None:
            raise StoreUnavailable(f"the MySQL store is not running ({self._error or 'closed'})")
        self._nursery.start_soon(fn, *args, name=name)

    async def close(self) -> None:
        """Cancel the background tasks, close the loop and wait for both; idempotent."""
        if not self._opened:
            return
        self._close_requested.set()
        with trio.CancelScope(shield=True):
            await self._stopped.wait()
