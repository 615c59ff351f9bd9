"""Rebuild the index from the directory at start (run in a worker thread).

Order: the newest snapshot (if any) gives the index at its cut; data segments are
read from the snapshot's high-water mark on (all of them without a snapshot),
each MESSAGE record adding or replacing its id; then the operation logs of the
snapshot's generation and later are replayed, each op applying only to the
record it names. Entries whose segment is gone are dropped, and segments no
entry lives in any more are deleted.

A sealed segment is read through its summary when it has a usable one (summary.py):
its records' heads, without their bodies. When the last segment is read from its
first record (no snapshot's mark inside it), that rebuilds the summary the writer
goes on with; otherwise no summary is written for it, and a later recovery reads it.

Damage: a bad record with no good record after it, in the *last* segment or the
*last* log, is a torn write: the file is truncated there (logged). The last segment,
if it was zero-filled ahead (preallocation.py), ends where its zeros begin; damage
within WRITE_SPAN of that end is a torn write too, good records after it or not,
and zeros with nothing before them but good records are unused space, cut off
without a warning. Anything else
— damage followed by good records, or a torn tail in a file that was sealed —
raises StoreCorrupted naming the file and offset, unless `repair` is set, which
skips the damage and keeps every readable record (logged); when the snapshot
itself is damaged, every data segment is read again to find the messages its
unreadable part held. `read_only` changes nothing on disk: torn tails are
reported, not truncated.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from stores.errors import StoreCorrupted
from stores.file import layout, records
from stores.file import snapshot as snapshots
from stores.file import summary as summaries
from stores.file.index import ENTRY, Index, unpack
from stores.file.messages import head_of
from stores.file.ops import decode_op
from stores.file.preallocation import split_damage, until_torn_write, zeros_start
from stores.file.records import RecordType
from stores.file.segment import Segment
from stores.file.summary import Summary

log = structlog.get_logger(__name__)

OnRecord = Callable[[bytes, int, int, int, int], None]


@dataclass
class Recovered:
    """What start() needs to go on from where the files end."""

    index: Index
    segments: dict[int, Segment]
    current: Segment
    data_end: int
    log_generation: int
    log_fd: int | None
    log_size: int
    snapshot_generation: int
    high_water: tuple[int, int]
    records: int = 0
    truncated: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    dropped: int = 0
    reclaimed: int = 0
    seconds: float = 0.0


class _Recovery:
    def __init__(self, directory: Path, *, repair: bool, read_only: bool) -> None:
        self.directory = directory
        self.repair = repair
        self.read_only = read_only
        self.index = Index()
        self.records = 0
        self.truncated: list[str] = []
        self.repaired: list[str] = []
        self.short: dict[int, int] = {}
        # Set when the snapshot was damaged: records before it are only added, never trusted over it.
        self.trusted_below: tuple[int, int] | None = None
        self.log = log.bind(store=str(directory))

    def run(self) -> Recovered:
        started = time.perf_counter()
        listing = layout.list_files(self.directory)
        snapshot_generation = listing.snapshots[-1] if listing.snapshots else 0
        high_water = scan_from = (0, layout.HEAD_SIZE)
        if snapshot_generation:
            high_water = scan_from = self._load_snapshot(snapshot_generation)
            if self.trusted_below is not None:  # a damaged snapshot: find what it lost in every segment
                scan_from = (0, layout.HEAD_SIZE)
        if not self.read_only:
            self._delete_stale(listing, snapshot_generation)
        segments = listing.segments
        summarized = set(listing.summaries)
        wanted = [number for number in segments if number >= scan_from[0]]
        unsummarized = [n for n in wanted if n == segments[-1] or n not in summarized]
        current_summary: Summary | None = None
        for number in wanted:
            start = scan_from[1] if number == scan_from[0] else layout.HEAD_SIZE
            last = number == segments[-1]
            if number in summarized and not last and self._read_summary(number, start):
                continue
            following = next((n for n in unsummarized if n > number), None)
            if following is not None:
                _prefetch(layout.path_of(self.directory, layout.SEGMENT, following))
            if last and start == layout.HEAD_SIZE:
                # Read whole: the summary the writer goes on with (else it writes none for it).
                current_summary = Summary()
                if not self._read_file(
                    layout.SEGMENT, number, start, last, self._message_reader(number, current_summary)
                ):
                    current_summary = None
            else:
                self._read_file(layout.SEGMENT, number, start, last, self._message_reader(number, None))
        logs = [generation for generation in listing.logs if generation >= snapshot_generation]
        for generation in logs:
            self._read_file(layout.LOG, generation, layout.HEAD_SIZE, generation == logs[-1], self._replay)
        self.index.rebuild(promoted=time.time())
        dropped = self._drop_unreachable(set(segments))
        opened = self._open_segments(segments)
        current = opened[max(opened)] if opened else self._new_segment(high_water[0] + 1)
        if opened:
            current.summary = current_summary  # set only when the last segment was read whole
        reclaimed = self._reclaim(opened, current)
        log_generation = max(logs[-1] if logs else 1, snapshot_generation)
        log_fd, log_size = self._open_log(log_generation, bool(logs) and logs[-1] == log_generation)
        data_end = os.fstat(current.fd).st_size if current.fd is not None else layout.HEAD_SIZE
        recovered = Recovered(
            index=self.index,
            segments=opened,
            current=current,
            data_end=data_end,
            log_generation=log_generation,
            log_fd=log_fd,
            log_size=log_size,
            snapshot_generation=snapshot_generation,
            high_water=high_water,
            records=self.records,
            truncated=self.truncated,
            repaired=self.repaired,
            dropped=dropped,
            reclaimed=reclaimed,
            seconds=time.perf_counter() - started,
        )
        self.log.info(
            "store.recovered",
            messages=len(self.index),
            records=self.records,
            segments=len(opened),
            snapshot=snapshot_generation,
            seconds=round(recovered.seconds, 3),
        )
        return recovered

    # -- files ------------------------------------------------------------------------------

    def _read_file(self, kind: str, number: int, start: int, last: bool, on_record: OnRecord) -> bool:
        """Read every record from `start` on; False if damage was skipped (with repair): what
        was read is then not all the file holds."""
        repaired = len(self.repaired)
        path = layout.path_of(self.directory, kind, number)
        data = path.read_bytes()
        problem = layout.head_problem(data, kind, number)
        # Where a zero-filled last segment's records end, and its zeros begin.
        zeros = zeros_start(data, kind) if last and not problem else None
        size = len(data) if zeros is None else zeros
        if start > size and start > layout.HEAD_SIZE:
            # The snapshot counted data up to `start` as durable: a shorter file lost acknowledged records.
            # (A mark at the header itself promises no records: a segment torn while being created.)
            self._damaged(
                path, size, f"its data ends before offset {start}, where the snapshot says data ends"
            )
            self.short[number] = size
        if problem:
            if last and records.find_next(data, -1, len(data)) is None:
                self._torn(path, 0, len(data), "the file was cut short while being created")
                if not self.read_only:
                    _reset(path, kind, number)
                return True
            self._damaged(path, 0, problem)
            start = layout.HEAD_SIZE
        scan = records.Scan(
            data, start, skip_damage=self.repair, stop=None if zeros is None else max(zeros, start)
        )
        for offset, rtype, payload_start, payload_end in until_torn_write(scan, zeros):
            try:
                on_record(data, offset, rtype, payload_start, payload_end)
            except (ValueError, struct.error, UnicodeDecodeError) as exc:
                self._damaged(path, offset, f"unreadable {_type_name(rtype)} record ({exc})")
            self.records += 1
        damages, torn = split_damage(scan.damages, zeros, last)
        for damage in damages:
            if damage.torn_tail:
                self._damaged(path, damage.offset, f"{damage.reason} at the end of a sealed file")
            else:
                self._damaged(path, damage.offset, f"{damage.reason}; good records follow at {damage.resume}")
        cut = zeros
        if torn is not None:
            self._torn(path, torn.offset, len(data) if zeros is None else zeros, torn.reason)
            cut = torn.offset
        if cut is not None and cut < len(data) and not self.read_only:
            if cut == zeros:
                self.log.info("store.unused_space_cut", file=str(path), offset=cut, bytes=len(data) - cut)
            _truncate(path, cut)
        return len(self.repaired) == repaired

    def _torn(self, path: Path, offset: int, size: int, reason: str) -> None:
        self.truncated.append(f"{path.name}@{offset}")
        self.log.warning(
            "store.torn_tail_truncated" if not self.read_only else "store.torn_tail_found",
            file=str(path),
            offset=offset,
            dropped_bytes=size - offset,
            reason=reason,
        )

    def _damaged(self, path: Path, offset: int, reason: str) -> None:
        if not self.repair:
            raise StoreCorrupted(
                f"{path}: damaged at offset {offset}: {reason}. This is not a torn write; restore the store "
                "from a backup, or start it with ?repair=true to keep every readable record "
                "(`kiteq-admin store verify` lists the damage)"
            )
        self.repaired.append(f"{path.name}@{offset}")
        self.log.warning("store.damage_skipped", file=str(path), offset=offset, reason=reason)

    # -- records ----------------------------------------------------------------------------

    def _message_reader(self, number: int, summary: Summary | None) -> OnRecord:
        """Index each record of segment `number`; add it to `summary` too, if given."""
        recover_record = self.index.recover_record
        trusted_below = self.trusted_below or (0, 0)

        def read(data: bytes, offset: int, rtype: int, start: int, end: int) -> None:
            if rtype != RecordType.MESSAGE:
                raise ValueError(f"a {_type_name(rtype)} record does not belong in a data segment")
            if summary is not None:
                summary.add(offset, end - offset, head_of(data, start))
            recover_record(data, start, number, offset, end - offset, trusted_below)

        return read

    def _read_summary(self, number: int, start: int) -> bool:
        """Index sealed segment `number` from its summary, from offset `start` on; False (and
        logged) if it cannot be used, for the segment to be read instead."""
        indexed = 0
        try:
            size = layout.path_of(self.directory, layout.SEGMENT, number).stat().st_size
            found = summaries.read(self.directory, number, size)
            if not isinstance(found, str):
                indexed = self.index.recover_records(found, number, start, self.trusted_below or (0, 0))
        except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
            found = str(exc)
        if isinstance(found, str):
            # What it indexed already is indexed again, the same, from the segment.
            self.log.warning(
                "store.summary_unused", segment=number, reason=found, detail="the segment is read instead"
            )
            return False
        self.records += indexed
        return True

    def _replay(self, data: bytes, offset: int, rtype: int, start: int, end: int) -> None:
        self.index.apply(decode_op(rtype, data, start, end), check_location=True)

    def _load_snapshot(self, generation: int) -> tuple[int, int]:
        path = layout.path_of(self.directory, layout.SNAPSHOT, generation)
        loaded = snapshots.load(path, generation, repair=self.repair)
        for damage in loaded.damages:
            self.repaired.append(f"{path.name}@{damage.offset}")
            self.log.warning(
                "store.damage_skipped", file=str(path), offset=damage.offset, reason=damage.reason
            )
        index = self.index
        index.topics.load(loaded.topics)
        index.reasons.load(loaded.reasons)
        index.groups.load(loaded.groups)
        index.entries = loaded.entries
        if loaded.damages:
            # Keep the entries the readable tables can describe; the data rescan finds the rest,
            # and a message finished before the snapshot may come back (delivered again, not lost).
            self.trusted_below = loaded.high_water
            sizes = (len(loaded.topics), len(loaded.groups), len(loaded.reasons))
            index.entries = {
                message_id: raw
                for message_id, raw in loaded.entries.items()
                if all(n < size for n, size in zip(ENTRY.unpack(raw)[6:9], sizes, strict=True))
            }
        self.records += len(index.entries)
        return loaded.high_water

    # -- aftermath ------------------------------------------------------------------------------

    def _delete_stale(self, listing: layout.Listing, snapshot_generation: int) -> None:
        """Leftovers of a compaction that crashed after its rename or before it finished."""
        stale = [*listing.temporary]
        stale += [
            layout.path_of(self.directory, layout.LOG, g) for g in listing.logs if g < snapshot_generation
        ]
        stale += [layout.path_of(self.directory, layout.SNAPSHOT, g) for g in listing.snapshots[:-1]]
        # A summary is only for a sealed segment: not for one that is gone, nor for the last.
        sealed = set(listing.segments[:-1])
        stale += [
            layout.path_of(self.directory, layout.SUMMARY, n) for n in listing.summaries if n not in sealed
        ]
        for path in stale:
            self.log.info("store.stale_file_deleted", file=str(path))
            path.unlink(missing_ok=True)

    def _drop_unreachable(self, existing: set[int]) -> int:
        """Drop entries whose record is gone.

        A whole segment is missing when it was deleted as empty before the ops that
        emptied it reached the disk (those messages were finished: dropping them is
        right). A segment shorter than its entries only gets here with repair.
        """
        missing = {number for number in self.index.segment_live if number not in existing}
        if not missing and not self.short:
            return 0
        gone = []
        for message_id, raw in self.index.entries.items():
            entry = unpack(raw)
            size = self.short.get(entry.segment)
            if entry.segment in missing or (size is not None and entry.offset + entry.length > size):
                gone.append(message_id)
        for message_id in gone:
            self.index.remove(message_id)
        self.index.emptied.clear()
        self.log.warning(
            "store.entries_dropped",
            count=len(gone),
            missing_segments=sorted(missing),
            short_segments=sorted(self.short),
            detail="their records are no longer on disk",
        )
        return len(gone)

    def _open_segments(self, numbers: list[int]) -> dict[int, Segment]:
        opened = {}
        for number in numbers:
            segment = Segment(number, layout.path_of(self.directory, layout.SEGMENT, number))
            segment.summary = None  # sealed, or read whole above (`run` gives the last its own)
            segment.open(writable=not self.read_only)
            opened[number] = segment
        return opened

    def _new_segment(self, number: int) -> Segment:
        return Segment(number, layout.path_of(self.directory, layout.SEGMENT, number))

    def _reclaim(self, segments: dict[int, Segment], current: Segment) -> int:
        """Delete the segments no entry lives in (except the one writes continue in)."""
        if self.read_only:
            return 0
        empty = [s for n, s in segments.items() if s is not current and not self.index.segment_live.get(n)]
        for segment in empty:
            segment.close()
            segment.unlink()
            del segments[segment.number]
        if empty:
            layout.fsync_dir(self.directory)
            self.log.info("store.segments_reclaimed", segments=[s.number for s in empty])
        return len(empty)

    def _open_log(self, generation: int, exists: bool) -> tuple[int | None, int]:
        if self.read_only or not exists:
            return None, layout.HEAD_SIZE
        path = layout.path_of(self.directory, layout.LOG, generation)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        return fd, os.fstat(fd).st_size


def recover(directory: Path, *, repair: bool, read_only: bool) -> Recovered:
    """Rebuild the store's state from `directory` (blocking; call it from a worker thread)."""
    return _Recovery(directory, repair=repair, read_only=read_only).run()


def _type_name(rtype: int) -> str:
    try:
        return RecordType(rtype).name
    except ValueError:
        return f"type-{rtype}"


def _prefetch(path: Path) -> None:
    """Let the kernel read the next segment while this one is parsed."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def _truncate(path: Path, offset: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def _reset(path: Path, kind: str, number: int) -> None:
    """Give a file whose creation was cut short its header again."""
    fd = os.open(path, os.O_RDWR | os.O_TRUNC | os.O_CLOEXEC)
    try:
        layout.write_all(fd, [layout.file_head(kind, number)], 0)
        os.fsync(fd)
    finally:
        os.close(fd)
