"""Snapshots: the whole index in one file, so the operation log can start over.

Compaction cuts the log at a batch boundary: generation g+1 begins, and the
snapshot `g+1.snap` holds the index exactly as it was at the cut, plus the data
high-water mark (the segment and offset the next save was to get). Recovery
loads the newest snapshot, reads data segments only from that mark, and
replays only the logs of generations >= the snapshot's. The snapshot is written
to a `.tmp` file, fsynced and renamed, and only then are the older logs and
snapshots deleted — a crash at any point leaves a directory that recovers.

Records after the FILE_HEAD: SNAPSHOT_HEAD, one SNAPSHOT_TABLE per interner
(topics, dead reasons, group lists), SNAPSHOT_ENTRIES chunks of (id, packed entry),
and SNAPSHOT_END with the entry count (a snapshot without it is incomplete).
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from stores.errors import StoreCorrupted
from stores.file import layout, records
from stores.file.forked import Forked
from stores.file.index import ENTRY, Groups
from stores.file.messages import pack_groups, unpack_groups, unpack_strings
from stores.file.records import RecordType

_HEAD = struct.Struct("<IIIQd")
_END = struct.Struct("<Q")
_ID_LEN = struct.Struct("<H")
_LEN = struct.Struct("<I")
_PAYLOAD_LENGTH_AT = 7  # where a record header keeps the payload length
_CHUNK_BYTES = 1 << 20
TOPICS, REASONS, GROUPS = 0, 1, 2


@dataclass
class Snapshot:
    """The index at a cut, and who writes it.

    Written by a child process forked at the cut (`child`), its fields are the live index:
    the child reads them in its copy-on-write image, and the parent never reads them again.
    Written by the compactor thread instead (`child` None: the system refused to fork), they
    are copies.
    """

    generation: int
    high_water: tuple[int, int]
    entries: dict[str, bytes]
    topics: list[str]
    reasons: list[str]
    groups: list[Groups]
    created: float = field(default_factory=time.time)
    child: Forked | None = None

    def copied(self) -> Snapshot:
        """The same snapshot over copies of the index, for a thread to write while it changes."""
        return replace(
            self,
            entries=dict(self.entries),
            topics=list(self.topics),
            reasons=list(self.reasons),
            groups=list(self.groups),
            child=None,
        )


def _table(kind: int, blobs: list[bytes]) -> bytes:
    """A SNAPSHOT_TABLE payload: the table's kind, then each value length-prefixed."""
    return bytes([kind]) + b"".join(_LEN.pack(len(blob)) + blob for blob in blobs)


def encode(snapshot: Snapshot) -> Iterator[bytes]:
    """Every record of the snapshot file after its FILE_HEAD, one at a time.

    A generator, so that the file is written as it is encoded: the child that writes it
    then holds one chunk at a time, not the whole file (about 90 MB at 942,816 entries;
    building it first took a forked child twice the page faults and 0.38-0.50 s of CPU,
    against 0.28-0.33 s streamed).
    """
    yield records.encode(
        RecordType.SNAPSHOT_HEAD,
        _HEAD.pack(snapshot.generation, *snapshot.high_water, len(snapshot.entries), snapshot.created),
    )
    yield records.encode(
        RecordType.SNAPSHOT_TABLE, _table(TOPICS, [topic.encode() for topic in snapshot.topics])
    )
    yield records.encode(
        RecordType.SNAPSHOT_TABLE, _table(REASONS, [reason.encode() for reason in snapshot.reasons])
    )
    yield records.encode(
        RecordType.SNAPSHOT_TABLE, _table(GROUPS, [pack_groups(*pair) for pair in snapshot.groups])
    )
    chunk = bytearray()
    for message_id, raw in snapshot.entries.items():
        raw_id = message_id.encode()
        chunk += _ID_LEN.pack(len(raw_id))
        chunk += raw_id
        chunk += raw
        if len(chunk) >= _CHUNK_BYTES:
            yield records.encode(RecordType.SNAPSHOT_ENTRIES, bytes(chunk))
            chunk.clear()
    if chunk:
        yield records.encode(RecordType.SNAPSHOT_ENTRIES, bytes(chunk))
    yield records.encode(RecordType.SNAPSHOT_END, _END.pack(len(snapshot.entries)))


def write_temporary(directory: Path, snapshot: Snapshot) -> int:
    """Write and fsync the snapshot under its `.tmp` name (see `install`); bytes written.

    Written as it is encoded (`layout.write_temporary`), so that its writeback comes in
    small parts the broker's own synced writes need not wait behind."""
    final = layout.path_of(directory, layout.SNAPSHOT, snapshot.generation)
    return layout.write_temporary(final, layout.SNAPSHOT, snapshot.generation, encode(snapshot))


def install(directory: Path, generation: int) -> None:
    """Rename the written snapshot of `generation` into place, then delete what it replaces.

    Only once everything before its cut is synced: the snapshot then takes over from the
    older logs and snapshots.
    """
    final = layout.path_of(directory, layout.SNAPSHOT, generation)
    os.rename(layout.temporary_of(final), final)
    layout.fsync_dir(directory)
    listing = layout.list_files(directory)
    for kind, generations in ((layout.LOG, listing.logs), (layout.SNAPSHOT, listing.snapshots)):
        for older in generations:
            if older < generation:
                layout.remove(layout.path_of(directory, kind, older))
    layout.fsync_dir(directory)


@dataclass
class Loaded:
    high_water: tuple[int, int]
    entries: dict[str, bytes]
    topics: list[str]
    reasons: list[str]
    groups: list[Groups]
    damages: list[records.Damage]


def load(path: Path, generation: int, *, repair: bool) -> Loaded:
    """Read a snapshot file back; damage raises StoreCorrupted unless `repair`.

    Record by record, so the file is never in memory whole next to the index it
    rebuilds; a repair reads it whole to scan past damage.
    """
    loaded = Loaded((0, layout.HEAD_SIZE), {}, [""], [""], [((), ())], [])
    if repair:
        data = path.read_bytes()
        scan = records.Scan(data, layout.HEAD_SIZE, skip_damage=True)
        complete = _apply_all(loaded, ((rtype, data, start, end) for _, rtype, start, end in scan))
        loaded.damages = scan.damages
        if not complete and not loaded.damages:
            loaded.damages = [records.Damage(len(data), None, "no SNAPSHOT_END record")]
        return loaded
    with path.open("rb") as f:
        head = f.read(layout.HEAD_SIZE)
        problem = layout.head_problem(head, layout.SNAPSHOT, generation)
        if problem:
            raise StoreCorrupted(f"{path}: {problem}")
        reader = _RecordReader(f, path)
        if not _apply_all(loaded, iter(reader)):
            raise StoreCorrupted(
                f"{path}: snapshot damaged at offset {reader.offset} ({reader.problem or 'no SNAPSHOT_END record'}); "
                "restore the store from a backup or start with ?repair=true to keep every readable entry"
            )
    return loaded


class _RecordReader:
    """The records of an open file, read one at a time; stops at the first bad one."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f = f
        self.path = path
        self.offset = layout.HEAD_SIZE
        self.problem = ""

    def __iter__(self) -> Iterator[tuple[int, bytes, int, int]]:
        while header := self.f.read(records.HEADER_SIZE):
            complete = len(header) == records.HEADER_SIZE
            length = _LEN.unpack_from(header, _PAYLOAD_LENGTH_AT)[0] if complete else 0
            data = header + self.f.read(min(length, records.MAX_PAYLOAD + 1))
            found = records.check(data, 0, len(data))
            if isinstance(found, str):
                self.problem = found
                return
            yield found[0], data, records.HEADER_SIZE, len(data)
            self.offset += len(data)


def _apply_all(loaded: Loaded, found: Iterator[tuple[int, bytes, int, int]]) -> bool:
    """Load every record into `loaded`; True if the snapshot ended with a matching SNAPSHOT_END."""
    complete = False
    for rtype, data, start, end in found:
        if rtype == RecordType.SNAPSHOT_HEAD:
            _gen, hwm_segment, hwm_offset, _count, _created = _HEAD.unpack_from(data, start)
            loaded.high_water = (hwm_segment, hwm_offset)
        elif rtype == RecordType.SNAPSHOT_TABLE:
            _load_table(loaded, data, start, end)
        elif rtype == RecordType.SNAPSHOT_ENTRIES:
            _load_entries(loaded.entries, data, start, end)
        elif rtype == RecordType.SNAPSHOT_END:
            complete = _END.unpack_from(data, start)[0] == len(loaded.entries)
    return complete


def _load_table(loaded: Loaded, data: bytes, start: int, end: int) -> None:
    kind = data[start]
    if kind == GROUPS:
        blobs, pos = [], start + 1
        while pos < end:
            (length,) = _LEN.unpack_from(data, pos)
            blobs.append(unpack_groups(data, pos + 4, pos + 4 + length))
            pos += 4 + length
        loaded.groups = blobs or loaded.groups
    elif kind == TOPICS:
        loaded.topics = unpack_strings(data, start + 1, end)
    elif kind == REASONS:
        loaded.reasons = unpack_strings(data, start + 1, end)


def _load_entries(entries: dict[str, bytes], data: bytes, start: int, end: int) -> None:
    size = ENTRY.size
    pos = start
    while pos < end:
        id_len = data[pos] | data[pos + 1] << 8
        pos += 2
        message_id = data[pos : pos + id_len].decode()
        pos += id_len
        entries[message_id] = data[pos : pos + size]
        pos += size
