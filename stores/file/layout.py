"""Names and headers of the files in a store directory.

    LOCK                  held with flock by the process that has the store open
    0000000001.seg        data segments: MESSAGE records, appended, never rewritten (one
                          zero-filled ahead is written in place: preallocation.py)
    0000000001.log        operation log of one generation: state changes since its snapshot
    0000000002.snap       the index as it was when generation 2 began (written by compaction)
    0000000001.sum        the summary of sealed segment 1: each record's place and head
    *.tmp                 a snapshot, summary or zero-filled segment being written, or a
                          replaced log or snapshot being deleted (`remove`); left over
                          only by a crash, then deleted

Every file starts with a FILE_HEAD record naming its kind and number, so a file
that was renamed or copied into the wrong place is refused, not misread.
"""

from __future__ import annotations

import os
import re
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from stores.file import records
from stores.file.records import RecordType

FORMAT_VERSION = 1
# The format of a data segment zero-filled ahead (preallocation.py): version 1's records,
# but its records end at the first all-zero byte, not where the file does.
ZERO_FILLED_VERSION = 2
LOCK_NAME = "LOCK"
SEGMENT = "seg"
LOG = "log"
SNAPSHOT = "snap"
SUMMARY = "sum"
_HEAD = struct.Struct("<4sIH")
_KIND_TAGS = {SEGMENT: b"SEG ", LOG: b"LOG ", SNAPSHOT: b"SNAP", SUMMARY: b"SUM "}
_NAME = re.compile(r"^(\d{10})\.(seg|log|snap|sum)$")
IOV_MAX = os.sysconf("SC_IOV_MAX")
# Freeing a big file's blocks in one go takes as long as there are blocks (ext4 mounted
# with `discard`: 124 ms for the last close of a 64 MiB segment here, 85 ms to unlink
# one), and every synced write of the store waits behind it. `remove` and `release`
# free a file this much at a time, so such a write waits for one step at most.
REMOVE_STEP = 1 << 20
# Work on the disk done in the background (freeing a file's blocks, writing a summary or
# snapshot here, zero-filling a segment ahead: preallocation.py) pauses this long after
# each step. Run back to back, the steps of freeing one segment, summarizing it and
# filling the next kept the store's synced writes waiting for 50-100 ms in a row at every
# new segment (messages paced at 5,000 a second, 16 MiB segments: p99 2.76-2.90 ms,
# against 1.60-1.95 with the pauses; RabbitMQ 1.41-1.59).
BACKGROUND_PAUSE = 0.01
# Files written whole (snapshots, summaries) are synced whenever this much was written
# since the last sync, as they go, then pause this long a MiB synced: BACKGROUND_PAUSE
# every 4 MiB, the pace of when they were synced 4 MiB at a time.
SYNC_EVERY_BYTES = 1 << 20
SYNC_PAUSE_PER_MIB = BACKGROUND_PAUSE / 4


def path_of(directory: Path, kind: str, number: int) -> Path:
    return directory / f"{number:010d}.{kind}"


def file_head(kind: str, number: int, version: int = FORMAT_VERSION) -> bytes:
    """The FILE_HEAD record every file of `kind` number `number` starts with."""
    return records.encode(RecordType.FILE_HEAD, _HEAD.pack(_KIND_TAGS[kind], number, version))


HEAD_SIZE = len(file_head(SEGMENT, 0))


def head_problem(data: bytes, kind: str, number: int) -> str | None:
    """Why `data` does not start with the right FILE_HEAD, or None when it does."""
    found = records.check(data, 0, len(data))
    if isinstance(found, str):
        return f"no file header ({found})"
    rtype, length = found
    if rtype != RecordType.FILE_HEAD or length != _HEAD.size:
        return "no file header"
    tag, found_number, version = _HEAD.unpack_from(data, records.HEADER_SIZE)
    if tag != _KIND_TAGS[kind] or found_number != number:
        return f"file header says {tag.decode(errors='replace').strip()} {found_number}, expected {kind} {number}"
    if version != FORMAT_VERSION and not (kind == SEGMENT and version == ZERO_FILLED_VERSION):
        return f"format version {version} is not supported (this build reads version {FORMAT_VERSION})"
    return None


def zero_filled(data: bytes) -> bool:
    """Whether `data`, a data segment with a good FILE_HEAD, was zero-filled ahead."""
    version: int = _HEAD.unpack_from(data, records.HEADER_SIZE)[2]
    return version == ZERO_FILLED_VERSION


@dataclass
class Listing:
    """The numbered files of a store directory, each list ascending."""

    segments: list[int] = field(default_factory=list)
    logs: list[int] = field(default_factory=list)
    snapshots: list[int] = field(default_factory=list)
    summaries: list[int] = field(default_factory=list)
    temporary: list[Path] = field(default_factory=list)


def list_files(directory: Path) -> Listing:
    listing = Listing()
    lists = {
        SEGMENT: listing.segments,
        LOG: listing.logs,
        SNAPSHOT: listing.snapshots,
        SUMMARY: listing.summaries,
    }
    for entry in os.scandir(directory):
        if entry.name.endswith(".tmp"):
            listing.temporary.append(Path(entry.path))
            continue
        match = _NAME.match(entry.name)
        if match:
            lists[match.group(2)].append(int(match.group(1)))
    for numbers in lists.values():
        numbers.sort()
    return listing


def temporary_of(path: Path) -> Path:
    """The `.tmp` name `path` is written under, or renamed to on its way out: recovery
    deletes any such file it finds."""
    return path.with_name(path.name + ".tmp")


def remove(path: Path) -> None:
    """Delete `path` (gone already is fine), freeing its blocks REMOVE_STEP at a time.

    It is first renamed to a `.tmp` name, so a crash part way leaves a leftover that
    recovery deletes, never a torn file under its own name.
    """
    doomed = temporary_of(path)
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return
    fd = os.open(doomed, os.O_WRONLY | os.O_CLOEXEC)
    try:
        _shrink(fd)
    finally:
        os.close(fd)
    doomed.unlink(missing_ok=True)


def drop_cached(path: Path) -> None:
    """Ask the kernel to drop `path`'s pages from the page cache (what it holds is synced,
    so they are clean and go at once); gone already is fine.

    A store that keeps every segment it writes cached grows the page cache by all it
    stores. On a virtual machine that hands free memory back to its host (free page
    reporting), each new page of that growth is first faulted in by the host: building a
    backlog of 2,000,000 messages, a 128 KiB write of zeros into a new segment took 0.35 ms
    after the first million against 0.045 before, the store's saves 14 % longer and the
    sends as much slower; with the pages of what is sealed dropped, the page cache stays at
    about the segments being written, and the rate held."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def release(fd: int) -> threading.Thread | None:
    """Close the last descriptor of an unlinked file on a thread of its own, its blocks
    freed REMOVE_STEP at a time first: closing it frees them all at once, and the caller
    (the event loop's thread, for a reclaimed segment) would wait for that. The thread;
    None for a file of one step or less, closed at once (there is little to free)."""
    if os.fstat(fd).st_size <= REMOVE_STEP:
        os.close(fd)
        return None
    thread = threading.Thread(target=_free, args=(fd,), name="kiteq-store-free", daemon=True)
    thread.start()
    return thread


def _free(fd: int) -> None:
    try:
        _shrink(fd)
    except OSError:
        pass  # a read-only descriptor cannot be shrunk: closing frees the blocks all the same
    finally:
        os.close(fd)


def _shrink(fd: int) -> None:
    """Cut the file down REMOVE_STEP at a time, to its first step, pausing in between."""
    size = os.fstat(fd).st_size
    while size > REMOVE_STEP:
        size -= REMOVE_STEP
        os.ftruncate(fd, size)
        time.sleep(BACKGROUND_PAUSE)


def write_temporary(final: Path, kind: str, number: int, body: Iterable[bytes]) -> int:
    """Write a file of `kind` under `final`'s `.tmp` name, its FILE_HEAD then each record of
    `body` as it comes, and fsync it; bytes written. The caller renames it into place.

    Synced every SYNC_EVERY_BYTES on the way, pausing SYNC_PAUSE_PER_MIB a MiB synced:
    on ext4 (data=ordered) the broker's synced writes otherwise queue behind the writeback
    of the whole file at its one fsync (in-place writes of 13-22 ms behind a 942,816-entry
    snapshot, against at most 7 ms synced every 4 MiB). They still wait for the step the
    disk is busy with: 3-4 ms for 4 MiB of a summary at a change of segment."""
    temporary = temporary_of(final)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        size = write_all(fd, [file_head(kind, number)], 0)
        unsynced = 0
        for record in body:
            written = write_all(fd, [record], size)
            size += written
            unsynced += written
            if unsynced >= SYNC_EVERY_BYTES:
                os.fdatasync(fd)
                time.sleep(SYNC_PAUSE_PER_MIB * unsynced / (1 << 20))
                unsynced = 0
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


def fsync_dir(directory: Path) -> None:
    """Make creations, renames and deletions in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, chunks: list[bytes], offset: int, flags: int = 0, *, span: int = 0) -> int:
    """pwritev every chunk at `offset` (IOV_MAX at a time, partial writes resumed); bytes written.

    `flags` are pwritev2's (RWF_DSYNC: each call returns once its range is on disk).
    `span`, if given, is the most bytes one call writes (a single longer chunk excepted).
    """
    total = 0
    pending = list(chunks)
    while pending:
        group = pending[: _group_size(pending, span)]
        want = sum(len(chunk) for chunk in group)
        done = os.pwritev(fd, group, offset + total, flags)
        total += done
        if done == want:
            del pending[: len(group)]
            continue
        # A short write: drop what was written, keep the rest of the chunk it stopped in.
        while done >= len(pending[0]):
            done -= len(pending.pop(0))
        pending[0] = pending[0][done:]
    return total


def _group_size(pending: list[bytes], span: int) -> int:
    """How many of `pending` one pwritev takes: IOV_MAX, fewer to stay within `span` bytes."""
    if not span:
        return min(len(pending), IOV_MAX)
    count = size = 0
    for chunk in pending[:IOV_MAX]:
        size += len(chunk)
        if count and size > span:
            break
        count += 1
    return count
