"""A small LRU of MESSAGE payloads, so a get soon after a save or a page reads no disk.

It holds payload bytes (already made by the save, so caching costs no copy), bounded
in bytes: bodies stay on disk, not in the index.
"""

from __future__ import annotations

from collections import OrderedDict


class PayloadCache:
    __slots__ = ("_items", "capacity", "hits", "misses", "size")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self.size = 0
        self.hits = 0
        self.misses = 0

    def get(self, message_id: str) -> bytes | None:
        payload = self._items.get(message_id)
        if payload is None:
            self.misses += 1
            return None
        self._items.move_to_end(message_id)
        self.hits += 1
        return payload

    def put(self, message_id: str, payload: bytes) -> None:
        if len(payload) > self.capacity:
            return
        old = self._items.pop(message_id, None)
        if old is not None:
            self.size -= len(old)
        self._items[message_id] = payload
        self.size += len(payload)
        while self.size > self.capacity:
            _, evicted = self._items.popitem(last=False)
            self.size -= len(evicted)

    def discard(self, message_id: str) -> None:
        old = self._items.pop(message_id, None)
        if old is not None:
            self.size -= len(old)

    def __len__(self) -> int:
        return len(self._items)
