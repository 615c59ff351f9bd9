"""The live connections of each group, and which one gets the next delivery or question."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Protocol

import trio

from kiteq.server.delivery.lanes import Delivery
from kiteq.server.tx.checks import TxCheck

# A warming-up connection starts at this share of a full one, so it still sees some traffic.
WARMUP_FLOOR = 0.1


class Peer(Protocol):
    """What delivery and the back-scan need of a client connection."""

    warmup_seconds: float
    authenticated_at: float

    @property
    def group(self) -> str: ...

    @property
    def inflight(self) -> int:
        """Deliveries sent to it and not answered yet."""

    @property
    def alive(self) -> bool: ...

    @property
    def congested(self) -> bool:
        """Too many of its deliveries wait unsent: give it no more until it drains."""

    def deliver(self, delivery: Delivery, timeout: float) -> None:
        """Send; `delivery.resolve` is called once it is answered, times out or the connection is lost."""

    def ask(self, check: TxCheck, timeout: float) -> None:
        """Ask a producer about a transaction; `check.resolve` is called as for a delivery."""


def warmup_weight(peer: Peer, now: float) -> float:
    """Linear ramp from WARMUP_FLOOR to 1 over the connection's declared warmingupSec."""
    if peer.warmup_seconds <= 0:
        return 1.0
    progress = (now - peer.authenticated_at) / peer.warmup_seconds
    return min(1.0, max(WARMUP_FLOOR, progress))


class GroupTable:
    """group -> authenticated connections; picks the least loaded, weighted by warm-up."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._groups: dict[str, list[Peer]] = defaultdict(list)
        self._rng = rng or random.Random()
        self._drained: dict[str, trio.Event] = {}

    def add(self, peer: Peer) -> None:
        self._groups[peer.group].append(peer)

    def remove(self, peer: Peer) -> None:
        peers = self._groups.get(peer.group)
        if peers and peer in peers:
            peers.remove(peer)
            if not peers:
                del self._groups[peer.group]

    def has_live(self, group: str) -> bool:
        return any(p.alive for p in self._groups.get(group, ()))

    def peers(self, group: str) -> list[Peer]:
        return [p for p in self._groups.get(group, ()) if p.alive]

    def groups(self) -> dict[str, int]:
        return {group: len(peers) for group, peers in self._groups.items()}

    async def wait_drained(self, group: str) -> None:
        """Until a congested connection of `group` drains (`drained` is called for it)."""
        event = self._drained.get(group)
        if event is None:
            event = self._drained[group] = trio.Event()
        await event.wait()

    def drained(self, group: str) -> None:
        event = self._drained.pop(group, None)
        if event is not None:
            event.set()

    def pick(self, group: str, now: float) -> Peer | None:
        """The least-loaded live connection among those eligible this time; None if all are congested.

        A warming-up connection is eligible with probability equal to its weight (as
        KiteQ's warm-up filter does), so it receives roughly that fraction of a full
        peer's share; if no connection is eligible, all live ones are. Ties between
        equally loaded peers are broken at random so they share evenly.
        """
        live = [p for p in self._groups.get(group, ()) if p.alive and not p.congested]
        if len(live) <= 1:
            return live[0] if live else None
        eligible = [
            p for p in live if p.warmup_seconds <= 0 or self._rng.random() < warmup_weight(p, now)
        ] or live
        least = min(p.inflight for p in eligible)
        return self._rng.choice([p for p in eligible if p.inflight == least])
