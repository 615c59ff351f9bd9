"""TLV records, the unit of every file of the store: framing and verification, sans-IO.

A record is an 11-byte header and a payload::

    magic  2 bytes  b"\\xa7Q" — lets a scan find the next record after damage
    crc    u32 LE   CRC-32 of everything after it: type, length and payload
    type   u8       RecordType
    length u32 LE   payload bytes (at most MAX_PAYLOAD)

`Scan` walks a file's bytes and yields every good record. The first bad one (wrong
magic, unknown type, a length past the end, a CRC mismatch) ends the walk, and the
scanner looks for any good record after it: none means a torn tail (a write that a
crash cut short, safe to truncate); one means damage in the middle, which only a
repair may skip. Nothing here touches a file.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

MAGIC = b"\xa7Q"
HEADER = struct.Struct("<2sIBI")
_CRC_START = 6  # the CRC covers the header from here on, and the payload
HEADER_SIZE = HEADER.size
_TYPE_LENGTH = struct.Struct("<BI")
# Far above a 2 MiB message and a snapshot chunk, far below what a corrupt length
# could make a reader allocate.
MAX_PAYLOAD = 64 << 20


class RecordType(enum.IntEnum):
    FILE_HEAD = 1
    MESSAGE = 2
    COMMIT = 3
    ROLLBACK = 4
    DELIVERY = 5
    FINISH = 6
    DEAD = 7
    REDRIVE = 8
    PURGE = 9
    SNAPSHOT_HEAD = 10
    SNAPSHOT_TABLE = 11
    SNAPSHOT_ENTRIES = 12
    SNAPSHOT_END = 13
    CANCEL = 14
    SUMMARY_ENTRIES = 15
    SUMMARY_END = 16


_KNOWN_TYPES = frozenset(RecordType)


def encode(rtype: int, payload: bytes) -> bytes:
    """One framed record."""
    crc = zlib.crc32(payload, zlib.crc32(_TYPE_LENGTH.pack(rtype, len(payload))))
    return HEADER.pack(MAGIC, crc, rtype, len(payload)) + payload


def check(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int] | str:
    """(type, length) of a good record at `pos`, or why there is none.

    Pass a memoryview when checking many records of one buffer: the CRC then reads
    the payload in place.
    """
    if end - pos < HEADER_SIZE:
        return "short header"
    magic, crc, rtype, length = HEADER.unpack_from(data, pos)
    if magic != MAGIC:
        return "bad magic"
    if rtype not in _KNOWN_TYPES:
        return f"unknown record type {rtype}"
    stop = pos + HEADER_SIZE + length
    if length > MAX_PAYLOAD or stop > end:
        return "length past the end"
    if zlib.crc32(data[pos + _CRC_START : stop]) != crc:
        return "CRC mismatch"
    return rtype, length


def find_next(data: bytes, pos: int, end: int) -> int | None:
    """Offset of the first good record after `pos`, or None."""
    at = data.find(MAGIC, pos + 1, end)
    while at != -1:
        if isinstance(check(data, at, end), tuple):
            return at
        at = data.find(MAGIC, at + 1, end)
    return None


# How much of a file's end `zeros_from` looks at in one go.
_ZERO_PROBE = 1 << 20


def zeros_from(data: bytes, start: int = 0) -> int:
    """Where the run of zero bytes that `data` ends with begins (len(data) if none), not
    before `start`: the end of what a zero-filled file holds. Reads back a MiB at a time
    without copying it, so a file with little unused space costs little."""
    high = len(data)
    while high > start:
        low = max(start, high - _ZERO_PROBE)
        if data.count(0, low, high) != high - low:
            return low + len(data[low:high].rstrip(b"\0"))
        high = low
    return start


@dataclass(frozen=True, slots=True)
class Damage:
    """A bad stretch of a file: from `offset` to `resume` (None: to the end, a torn tail)."""

    offset: int
    resume: int | None
    reason: str

    @property
    def torn_tail(self) -> bool:
        return self.resume is None


class Scan:
    """The good records of `data[start:stop]`, in order; `end` and `damages` tell how it ended.

    Without `skip_damage` the walk stops at the first damage; with it, it resumes at
    the next good record (a repair keeps every record it can read). `end` is the
    offset just past the last good record.
    """

    def __init__(
        self, data: bytes, start: int = 0, *, skip_damage: bool = False, stop: int | None = None
    ) -> None:
        self.data = data
        self.start = start
        self.stop = len(data) if stop is None else stop
        self.skip_damage = skip_damage
        self.end = start
        self.damages: list[Damage] = []

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        """Yield (offset, type, payload start, payload end) of each good record."""
        data, size, pos = self.data, self.stop, self.start
        with memoryview(data) as view:
            while pos < size:
                found = check(view, pos, size)
                if isinstance(found, str):
                    resume = find_next(data, pos, size)
                    self.damages.append(Damage(pos, resume, found))
                    if resume is None or not self.skip_damage:
                        return
                    pos = resume
                    continue
                rtype, length = found
                payload = pos + HEADER_SIZE
                yield pos, rtype, payload, payload + length
                pos = payload + length
                self.end = pos
