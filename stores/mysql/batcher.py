"""Group many tasks' small writes into few statements and transactions.

Callers `submit()` one item and wait for its own result; `flushers` background tasks
each take whatever is queued (up to `max_items` and `max_bytes`) and write it with one
`flush(items)` call — one transaction on the master — then hand every caller its
result. Under load, batches grow by themselves while the previous flush runs; alone,
an item is written at once. The queue is a bounded channel: when it is full,
`submit()` waits (backpressure), it never drops.

Guarantees: `submit()` returns only after the flush that carried the item committed
(or raises the error that flush raised). A caller cancelled before its item left the
queue takes it out; once the item is in flight, cancelling the caller does not stop
the write (its outcome is then unknown to that caller, as with any timeout).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import structlog
import trio

from stores.errors import StoreError, StoreUnavailable

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False, slots=True)
class _Pending(Generic[T, R]):
    item: T
    size: int
    done: trio.Event = field(default_factory=trio.Event)
    abandoned: bool = False
    result: R | None = None
    error: BaseException | None = None


@dataclass(slots=True)
class BatchStats:
    batches: int = 0
    items: int = 0
    largest: int = 0
    failures: int = 0


class Batcher(Generic[T, R]):
    """Items in, one result per item out; `flush` sees lists of items."""

    def __init__(
        self,
        name: str,
        flush: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_items: int,
        max_bytes: int,
        flushers: int,
    ) -> None:
        self.name = name
        self.stats = BatchStats()
        self._flush = flush
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._flushers = flushers
        self._send, self._receive = trio.open_memory_channel[_Pending[T, R]](max_items * flushers)
        self._running = 0
        self._drained = trio.Event()
        self._log = structlog.get_logger(__name__).bind(batcher=name)

    def start(self, start_soon: Callable[..., None]) -> None:
        """Start the flusher tasks with `start_soon` (the owner's nursery)."""
        self._running = self._flushers
        for number in range(self._flushers):
            start_soon(
                self._flusher, self._receive.clone(), name=f"stores.mysql {self.name} flusher {number}"
            )
        self._receive.close()

    async def submit(self, item: T, size: int = 0) -> R:
        """Queue `item` (`size` bytes toward max_bytes), wait until its batch committed, return its result."""
        pending: _Pending[T, R] = _Pending(item, size)
        try:
            await self._send.send(pending)
            await pending.done.wait()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise StoreUnavailable(f"the MySQL store is closed ({self.name} not accepted)") from None
        except BaseException:
            pending.abandoned = True
            raise
        if pending.error is not None:
            raise pending.error
        return pending.result  # type: ignore[return-value]

    async def drain(self) -> None:
        """Stop accepting items, write what is queued, and wait for the flushers to end."""
        await self._send.aclose()
        if self._running:
            await self._drained.wait()

    async def _flusher(self, receive: trio.MemoryReceiveChannel[_Pending[T, R]]) -> None:
        try:
            async with receive:
                try:
                    async for first in receive:
                        await self._write(self._collect(first, receive))
                finally:
                    if self._running == 1:
                        self._fail_queued(receive)
        finally:
            self._running -= 1
            if not self._running:
                self._drained.set()

    def _collect(
        self, first: _Pending[T, R], receive: trio.MemoryReceiveChannel[_Pending[T, R]]
    ) -> list[_Pending[T, R]]:
        batch, size = [first], first.size
        while len(batch) < self._max_items and size < self._max_bytes:
            try:
                pending = receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            batch.append(pending)
            size += pending.size
        return [p for p in batch if not p.abandoned]

    def _fail_queued(self, receive: trio.MemoryReceiveChannel[_Pending[T, R]]) -> None:
        """The last flusher is going (cancelled at close): nobody will write what is queued."""
        while True:
            try:
                pending = receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return
            pending.error = StoreUnavailable(f"the MySQL store closed before this {self.name} was written")
            pending.done.set()

    async def _write(self, batch: list[_Pending[T, R]]) -> None:
        if not batch:
            return
        try:
            results = await self._flush([p.item for p in batch])
        except StoreError as exc:
            self._failed(batch, exc)
            self._log.warning("mysql.batch.failed", items=len(batch), error=str(exc))
        except Exception as exc:
            # Never let one bad batch kill the flusher: its callers get the error.
            self._failed(batch, StoreError(f"MySQL {self.name} batch failed: {exc!r}"))
            self._log.error("mysql.batch.crashed", items=len(batch), exc_info=exc)
        except BaseException:
            self._failed(
                batch,
                StoreUnavailable(f"the MySQL store closed while writing this {self.name}; outcome unknown"),
            )
            raise
        else:
            self.stats.batches += 1
            self.stats.items += len(batch)
            self.stats.largest = max(self.stats.largest, len(batch))
            for pending, result in zip(batch, results, strict=True):
                pending.result = result
                pending.done.set()

    def _failed(self, batch: list[_Pending[T, R]], error: StoreError) -> None:
        self.stats.failures += 1
        for pending in batch:
            pending.error = error
            pending.done.set()
