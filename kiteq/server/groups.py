"""The live consumer connections of each group, and which one gets the next delivery."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Protocol

# A warming-up connection starts at this share of a full one, so it still sees some traffic.
WARMUP_FLOOR = 0.1


class Peer(Protocol):
    group: str
    inflight: int
    warmup_seconds: float
    authenticated_at: float

    @property
    def alive(self) -> bool: ...


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

    def pick(self, group: str, now: float) -> Peer | None:
        """The live connection with the lowest in-flight count per unit of weight.

        A connection at weight w looks (1/w) times as loaded as it is, so while warming
        up it receives about w of a full peer's share. Ties are broken at random so
        equal peers share evenly.
        """
        best: Peer | None = None
        best_load = 0.0
        for peer in self._groups.get(group, ()):
            if not peer.alive:
                continue
            load = (peer.inflight + 1) / warmup_weight(peer, now)
            if best is None or load < best_load or (load == best_load and self._rng.random() < 0.5):
                best, best_load = peer, load
        return best
