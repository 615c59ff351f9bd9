"""Which connections the broker holds, and which one makes room for a newcomer.

Pure bookkeeping over connection objects (anything hashable). Connections count
against `max_connections` from accept to close. Until they authenticate they also
count against `max_unauthenticated` and, per address, `max_unauthenticated_per_address`.
When a newcomer finds one of those full, the *oldest* unauthenticated connection in
the way is evicted instead of the newcomer being refused: a peer that has proved
nothing cannot hold a slot against one that is about to, so a flood of silent
connections (slowloris) only ever evicts itself, while a real client, which sends its
ConnMeta at once and is the newest, gets through. Only when every slot is taken by
authenticated connections is a newcomer refused.
"""

from __future__ import annotations

from collections.abc import Hashable


class Admission:
    def __init__(self, max_connections: int, max_unauthenticated: int, max_per_address: int) -> None:
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self.max_per_address = max_per_address
        self._admitted: set[Hashable] = set()
        # Insertion order is age: the first entry is the oldest.
        self._unauthenticated: dict[Hashable, str] = {}
        self._by_address: dict[str, dict[Hashable, None]] = {}

    @property
    def total(self) -> int:
        return len(self._admitted)

    @property
    def unauthenticated(self) -> int:
        return len(self._unauthenticated)

    def admit(self, connection: Hashable, address: str) -> list[Hashable] | None:
        """Take `connection` in: the connections to evict for it, or None when it is refused."""
        victims: list[Hashable] = []
        same_address = self._by_address.get(address, {})
        if len(same_address) >= self.max_per_address:
            victims.append(next(iter(same_address)))
        if len(self._unauthenticated) - len(victims) >= self.max_unauthenticated:
            victims.append(self._oldest_except(victims))
        if self.total - len(victims) >= self.max_connections:
            if len(self._unauthenticated) <= len(victims):
                return None  # every slot is an authenticated connection
            victims.append(self._oldest_except(victims))
        for victim in victims:
            self.closed(victim)
        self._admitted.add(connection)
        self._unauthenticated[connection] = address
        self._by_address.setdefault(address, {})[connection] = None
        return victims

    def authenticated(self, connection: Hashable) -> None:
        """It proved its group: it no longer counts as unauthenticated (nor can it be evicted)."""
        address = self._unauthenticated.pop(connection, None)
        if address is not None:
            self._forget_address(connection, address)

    def closed(self, connection: Hashable) -> None:
        """It is gone (or evicted); calling this again for it does nothing."""
        self.authenticated(connection)
        self._admitted.discard(connection)

    def _oldest_except(self, skip: list[Hashable]) -> Hashable:
        return next(c for c in self._unauthenticated if c not in skip)

    def _forget_address(self, connection: Hashable, address: str) -> None:
        peers = self._by_address[address]
        del peers[connection]
        if not peers:
            del self._by_address[address]
