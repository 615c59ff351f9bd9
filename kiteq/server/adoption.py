"""Taking over the rows of a dead broker in a store several brokers share (MySQL).

Each broker scans only the rows it owns, so a broker that dies leaves its unfinished
messages waiting. A live broker adopts them once the registry has shown the owner
absent for `adopt_after` seconds without a break: long enough that a broker which
only lost its registry session for a moment keeps its rows. When the registry
cannot be read, absence cannot be established, and the clocks start over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
import trio

from kiteq.errors import RegistryError
from kiteq.registry.base import Registry
from stores import SharedStore, StoreError

log = structlog.get_logger(__name__)

MIN_CHECK_INTERVAL = 0.25
MAX_CHECK_INTERVAL = 10.0


@dataclass
class AbsenceTracker:
    """Which row owners have been missing from the registry long enough to adopt (sans-IO)."""

    me: str
    adopt_after: float
    _missing_since: dict[str, float] = field(default_factory=dict)

    def observe(self, now: float, owners: set[str], live: set[str]) -> list[str]:
        """Record one look at the store's owners and the registry; the owners to adopt now."""
        absent = owners - live - {self.me, ""}
        self._missing_since = {owner: self._missing_since.get(owner, now) for owner in absent}
        return sorted(
            owner for owner, since in self._missing_since.items() if now - since >= self.adopt_after
        )

    def unknown(self) -> None:
        """The registry or store could not be read: no absence is proven any more."""
        self._missing_since.clear()

    def adopted(self, owner: str) -> None:
        self._missing_since.pop(owner, None)


class AdoptLoop:
    def __init__(
        self, store: SharedStore, registry: Registry, adopt_after: float, on_adopted: Callable[[], None]
    ) -> None:
        self.store = store
        self.registry = registry
        self.adopt_after = adopt_after
        self.on_adopted = on_adopted

    async def run(self) -> None:
        tracker = AbsenceTracker(self.store.owner, self.adopt_after)
        interval = min(max(self.adopt_after / 4, MIN_CHECK_INTERVAL), MAX_CHECK_INTERVAL)
        while True:
            await trio.sleep(interval)
            try:
                servers = await self.registry.list_servers()
                live = {address for addresses in servers.values() for address in addresses}
                owners = await self.store.owners()
            except (RegistryError, StoreError) as exc:
                log.warning("adoption.unknown", error=str(exc))
                tracker.unknown()
                continue
            for dead in tracker.observe(trio.current_time(), owners, live):
                if await self._adopt(dead):
                    tracker.adopted(dead)

    async def _adopt(self, dead: str) -> bool:
        try:
            moved = await self.store.adopt(dead)
        except StoreError as exc:
            log.warning("adoption.failed", dead_broker=dead, error=str(exc))
            return False
        log.info("adoption.done", dead_broker=dead, messages=moved, absent_for=self.adopt_after)
        self.on_adopted()
        return True
