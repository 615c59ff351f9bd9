"""What Producer and Consumer share: registry, broker pool, nursery, delivery log."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable
from types import TracebackType
from typing import Self

import structlog
import trio

from kiteq.client.brokers import BrokerPool
from kiteq.client.connection import ClientConnection, Credentials
from kiteq.client.options import ClientOptions
from kiteq.delivery_log import DeliveryLog
from kiteq.errors import KiteQError, leaf_error
from kiteq.registry import Registry, open_registry
from kiteq.tls import client_context
from protocol import Frame

log = structlog.get_logger(__name__)

# Bounds the final flush of queued acks and tx decisions on exit; on loopback or a LAN
# it takes milliseconds, so this only matters when a broker stopped reading.
FLUSH_TIMEOUT = 5.0


class Client:
    """An async context manager owning one nursery in which all its tasks run."""

    role = "client"

    def __init__(
        self, registry: str | Registry, options: ClientOptions, topics: Iterable[str], warmup_seconds: int = 0
    ) -> None:
        self.registry = open_registry(registry) if isinstance(registry, str) else registry
        self.options = options
        self.group = options.group
        self.topics = sorted(set(topics))
        # Converted once, so a bad CA file fails here and every connection shares one context.
        self.pool = BrokerPool(
            self.registry,
            self.topics,
            Credentials(options.group, options.secret, warmup_seconds),
            self._on_request,
            self._answers_due,
            tls=client_context(options.tls),
        )
        self.delivery_log = DeliveryLog(options.delivery_log, self.role) if options.delivery_log else None
        self.address = f"{socket.gethostname()}:{os.getpid()}:{id(self) & 0xFFFF:x}"
        self._nursery: trio.Nursery | None = None
        self._stack: contextlib.AsyncExitStack | None = None

    @property
    def nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError(f"use the {type(self).__name__} inside `async with`")
        return self._nursery

    async def __aenter__(self) -> Self:
        """Connect; raises AuthError or TLSError if a broker refuses us (not an ExceptionGroup)."""
        try:
            await self._enter()
        except BaseExceptionGroup as group:
            error = leaf_error(group, (KiteQError,))
            if error is None:
                raise
            raise error from None
        return self

    async def _enter(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.registry)
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            if self.delivery_log is not None:
                stack.callback(self.delivery_log.close)
                self._nursery.start_soon(self.delivery_log.run)
            await self._started()
            await self._nursery.start(self.pool.run)
            if not await self.pool.wait_connected(self.options.connect_timeout):
                log.warning(
                    f"{self.role}.not_connected", topics=self.topics, detail="still trying in the background"
                )
            self._stack = stack.pop_all()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Finish work in flight, flush what is queued for the brokers, then disconnect."""
        try:
            await self._stopping()
            await self.pool.close(FLUSH_TIMEOUT)
        finally:
            self.nursery.cancel_scope.cancel()
            assert self._stack is not None
            await self._stack.aclose()
            self._nursery = None

    async def _started(self) -> None:
        """Hook: publish what this client is in the registry."""

    async def _stopping(self) -> None:
        """Hook: finish work in flight before the connections close."""

    def _answers_due(self) -> int:
        """How many of the broker's requests are being handled (their answers will follow)."""
        return 0

    async def _on_request(self, connection: ClientConnection, frame: Frame, body: object) -> None:
        log.warning(f"{self.role}.unexpected_request", cmd=frame.cmd.name)
