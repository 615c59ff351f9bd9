"""A sorted set of message ids, for paging in id order without sorting per page.

Ids live in chunks of at most `2 * LOAD` sorted strings, with each chunk's last id in
`_maxes` (the layout of sortedcontainers' SortedList): add and discard cost a bisect
plus a move within one chunk, and a page from a cursor is a bisect and a walk. The
ids are the index's own str objects, so a member costs one pointer.
"""

from __future__ import annotations

import itertools
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

LOAD = 1000


class SortedIds:
    __slots__ = ("_chunks", "_len", "_maxes")

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._chunks: list[list[str]] = []
        self._maxes: list[str] = []
        self._len = 0
        self.rebuild(ids)

    def rebuild(self, ids: Iterable[str]) -> None:
        """Replace the contents in one sort (what recovery and bulk moves use).

        Duplicates are dropped by one pass over the sorted list, not through a set:
        at a million ids a set would cost tens of MiB more at the peak of recovery.
        """
        ordered = sorted(ids)
        if any(map(operator.eq, ordered, itertools.islice(ordered, 1, None))):
            ordered = [v for i, v in enumerate(ordered) if not i or v != ordered[i - 1]]
        self._chunks = [ordered[i : i + LOAD] for i in range(0, len(ordered), LOAD)]
        self._maxes = [chunk[-1] for chunk in self._chunks]
        self._len = len(ordered)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        for chunk in self._chunks:
            yield from chunk

    def __contains__(self, message_id: str) -> bool:
        i = bisect_left(self._maxes, message_id)
        if i == len(self._maxes):
            return False
        chunk = self._chunks[i]
        j = bisect_left(chunk, message_id)
        return j < len(chunk) and chunk[j] == message_id

    def add(self, message_id: str) -> None:
        maxes = self._maxes
        if not maxes:
            self._chunks.append([message_id])
            maxes.append(message_id)
            self._len = 1
            return
        i = bisect_left(maxes, message_id)
        if i == len(maxes):
            i -= 1
            chunk = self._chunks[i]
            chunk.append(message_id)
            maxes[i] = message_id
        else:
            chunk = self._chunks[i]
            j = bisect_left(chunk, message_id)
            if j < len(chunk) and chunk[j] == message_id:
                return
            chunk.insert(j, message_id)
        self._len += 1
        if len(chunk) > 2 * LOAD:
            self._chunks[i : i + 1] = [chunk[:LOAD], chunk[LOAD:]]
            maxes[i : i + 1] = [chunk[LOAD - 1], chunk[-1]]

    def update(self, ids: list[str]) -> None:
        """Add many: one merge when they are many, else one by one.

        The merge sorts the new ids apart and appends them to the current ones, so the
        sort finds two ordered runs and merges them in linear time (a promotion of a
        few hundred thousand ids into a million took a third longer sorted as one).
        """
        if len(ids) > max(64, self._len // 8):
            self.rebuild(itertools.chain(itertools.chain.from_iterable(self._chunks), sorted(ids)))
        else:
            for message_id in ids:
                self.add(message_id)

    def discard(self, message_id: str) -> None:
        maxes = self._maxes
        i = bisect_left(maxes, message_id)
        if i == len(maxes):
            return
        chunk = self._chunks[i]
        j = bisect_left(chunk, message_id)
        if j == len(chunk) or chunk[j] != message_id:
            return
        del chunk[j]
        self._len -= 1
        if not chunk:
            del self._chunks[i]
            del maxes[i]
        else:
            maxes[i] = chunk[-1]

    def after(self, cursor: str | None) -> Iterator[str]:
        """Ids greater than `cursor` (all ids for None), in order.

        The set must not change while the iterator is used.
        """
        maxes = self._maxes
        i = 0 if cursor is None else bisect_right(maxes, cursor)
        for k in range(i, len(maxes)):
            chunk = self._chunks[k]
            j = 0 if cursor is None or k > i else bisect_right(chunk, cursor)
            yield from chunk[j:] if j else chunk
