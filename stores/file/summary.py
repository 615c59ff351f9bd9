"""Segment summaries: a sealed segment's records as the index sees them, in a file of its own.

Recovery reads the data written since the last snapshot. Without summaries, a backlog
(messages saved, none finished, so nothing in the log) made that grow with every
segment, and bounding it took a snapshot every few segments: a fork and an encoding
of the whole index, work that grew with the backlog (a million-message backlog's
sends ran 7-10 % slower in the tenths that held one). With them, recovery reads a
sealed segment's summary instead of the segment, so snapshots are needed only when
the log grows, and a segment costs the same whatever the backlog.

The writer builds a segment's summary as records are appended to it (`Summary.add`,
on the Trio thread: the record's place and its payload's head, about 144 bytes for a
message of the benchmarks), and writes it once the segment is sealed (`write`, on a
thread of its own): to `N.sum.tmp`, synced, renamed to `N.sum`. Recovery trusts a
summary only when it is whole and matches its segment's size (`read`); anything else
(missing, torn, damaged) has the segment read instead. A summary is redundant: losing
one costs time at the next start, never data.

Records after the FILE_HEAD: SUMMARY_ENTRIES chunks of (offset u32, length u32,
head length u32, head), in the segment's order, then SUMMARY_END with the entry
count and the segment's size.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

from stores.file import layout, records
from stores.file.records import RecordType

_ENTRY = struct.Struct("<III")
_END = struct.Struct("<QQ")
_CHUNK_BYTES = 1 << 20


class Summary:
    """The summary of one segment, built as its records are appended (one thread at a time)."""

    __slots__ = ("chunks", "count", "open")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.open = bytearray()
        self.count = 0

    def add(self, offset: int, length: int, head: bytes) -> None:
        """The record at `offset`, `length` bytes long, whose MESSAGE payload starts with `head`."""
        self.open += _ENTRY.pack(offset, length, len(head))
        self.open += head
        self.count += 1
        if len(self.open) >= _CHUNK_BYTES:
            self.chunks.append(bytes(self.open))
            self.open.clear()


def encode(summary: Summary, segment_size: int) -> Iterator[bytes]:
    """Every record of the summary file after its FILE_HEAD."""
    for chunk in summary.chunks:
        yield records.encode(RecordType.SUMMARY_ENTRIES, chunk)
    if summary.open:
        yield records.encode(RecordType.SUMMARY_ENTRIES, bytes(summary.open))
    yield records.encode(RecordType.SUMMARY_END, _END.pack(summary.count, segment_size))


def write(directory: Path, number: int, summary: Summary) -> Path:
    """Write segment `number`'s summary beside it (blocking); its path.

    Only for a sealed segment: its size is the one the summary vouches for."""
    final = layout.path_of(directory, layout.SUMMARY, number)
    size = os.stat(layout.path_of(directory, layout.SEGMENT, number)).st_size
    layout.write_temporary(final, layout.SUMMARY, number, encode(summary, size))
    os.rename(layout.temporary_of(final), final)
    return final


Entry = tuple[int, int, bytes, int]


def read(directory: Path, number: int, segment_size: int) -> list[Entry] | str:
    """Segment `number`'s summary as (offset, length, data, head start), or why it cannot be used."""
    path = layout.path_of(directory, layout.SUMMARY, number)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    problem = layout.head_problem(data, layout.SUMMARY, number)
    if problem:
        return problem
    entries: list[Entry] = []
    scan = records.Scan(data, layout.HEAD_SIZE)
    for _offset, rtype, start, end in scan:
        if rtype == RecordType.SUMMARY_ENTRIES:
            _unpack_entries(entries, data, start, end)
        elif rtype == RecordType.SUMMARY_END:
            count, size = _END.unpack_from(data, start)
            if count != len(entries):
                return f"it ends after {len(entries)} entries, not the {count} it counts"
            if size != segment_size:
                return f"it describes {size} bytes of the segment, which has {segment_size}"
            return entries
        else:
            return f"a record of type {rtype} does not belong in a summary"
    if scan.damages:
        return f"damaged at offset {scan.damages[0].offset} ({scan.damages[0].reason})"
    return "no SUMMARY_END record"


def _unpack_entries(entries: list[Entry], data: bytes, start: int, end: int) -> None:
    pos = start
    while pos < end:
        offset, length, head_length = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        entries.append((offset, length, data, pos))
        pos += head_length
