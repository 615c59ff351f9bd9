"""Data segments zero-filled ahead of need, on a thread of their own.

A synced append changes its file's size, so the file system commits its journal
for it: on ext4 here, a 5 KB write with RWF_DSYNC took 168-187 µs appended against
91-104 µs written over space already written, and 95-111 against 63-69 µs of CPU.
So while the writer fills segment N, a preparer thread writes segment N+1 whole
under its `.tmp` name: a FILE_HEAD of format ZERO_FILLED_VERSION, then zeros up to
the segment size, synced FILL_STEP at a time and, unless it is late, pausing in
between (`pause_after_step`), so that the store's own synced writes never queue behind
a long writeback. When the writer moves on to N+1 it renames the
file into place (`take`); a segment that is not ready yet is created empty, as
without preallocation, and the preparer moves on to the one after. A segment that
appends is left as soon as the next is ready (`Writer.appending`).

Written in place, a segment's records no longer end where its file does, but where
its zeros begin. A synced write that a crash cut short may have reached the disk in
any order within its range, leaving good records after a hole; the writer splits
its writes into zero-filled space at WRITE_SPAN bytes, so such damage lies within
WRITE_SPAN of the end of what the file holds, and recovery treats damage there,
in the last segment, as a torn write (`torn_write`). The writer cuts the unused
zeros off when it seals the segment or closes the store.

Only for `fsync=batch` and `always`: there each write into a segment is synced
before the next, so at most one write is torn. With `fsync=never` a crash may keep
any of many unsynced writes, and segments are appended.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import structlog

from stores.file import layout, records

log = structlog.get_logger(__name__)

# The most bytes one synced write into zero-filled space covers (a longer record alone
# excepted): how far from the end of its records a torn write may leave damage.
WRITE_SPAN = 1 << 20
# Zeros are written and synced this much at a time. The store's synced writes wait for the
# step the disk is busy with: a MiB took 5-7 ms when the writer changed segments, and
# messages paced at 5,000 a second had a p99 of 3.5-4.4 ms against 2.2-2.3 with 128 KiB
# (64 KiB, more flushes, did no better).
FILL_STEP = 128 << 10
# The pause after each step while the fill is on time (`pause_after_step`):
# `layout.BACKGROUND_PAUSE` a MiB, as with steps of a MiB (a segment of 64 MiB in about a
# second at best).
FILL_PAUSE = layout.BACKGROUND_PAUSE * FILL_STEP / (1 << 20)
# A fill keeps pace with the writer (`step_due`): it is to be done once writes are this
# far through the segment before it, and takes a step whenever finishing flat out would
# take the time left until then divided by MARGIN, or more.
DONE_BY = 0.5
MARGIN = 1.5
# How often a fill that is ahead looks at the writer's progress again, and the shortest
# span over which the writer's recent rate is taken (none over it: the writer is idle).
PACE_CHECK = 0.02
RECENT = 0.1
_ZEROS = memoryview(bytes(FILL_STEP))


def zeros_start(data: bytes, kind: str) -> int | None:
    """Where the zeros of a data segment zero-filled ahead begin, its records ending
    there (not before its FILE_HEAD); None for any other file. `data` has a good FILE_HEAD."""
    if kind != layout.SEGMENT or not layout.zero_filled(data):
        return None
    return records.zeros_from(data, layout.HEAD_SIZE)


def step_due(writer_at: float, writer_rate: float, filled: float, fill_rate: float) -> bool:
    """Whether a fill takes its next step now. Shares of a segment, rates per second:
    `writer_at` how far writes are through the segment before (1.0: they need this one),
    `writer_rate` how fast they go (0.0: they stand still), `filled` how much of this
    one is filled, `fill_rate` how fast the fill went while it ran.

    Flat out, a fill put its zeros on the disk just as the writer changed segments,
    beside the summary of the sealed one and the freeing of an emptied one: for about a
    second, the store's synced writes waited behind its steps (messages paced at 5,000 a
    second: p50 0.9-1.3 ms, against 0.6). Paced, a segment filling at that rate is
    zero-filled over half its time; one filling faster than a fill can go (a backlog
    built at 50,000 messages a second) still gets it flat out. So does a writer standing
    still: there is nothing to disturb, and a burst after the lull then finds the
    segment ready, not a fill paced for the slow writes before the lull."""
    if writer_at >= DONE_BY or fill_rate <= 0.0 or writer_rate <= 0.0:
        return True
    return MARGIN * (1.0 - filled) / fill_rate >= (DONE_BY - writer_at) / writer_rate


def pause_after_step(writer_at: float) -> float:
    """Seconds a fill pauses after a step, `writer_at` being how far writes are through
    the segment before (as for `step_due`).

    On time, it pauses (FILL_PAUSE), so that the store's synced writes rarely queue behind
    one of its steps. Late (writes are past DONE_BY, or need the segment, or append while
    they wait for it), it does not: paused, a fill moved about 47 MB a second beside a
    backlog being built at 42,000 messages a second (50 MB a second), so every other
    segment appended, and an appended write took twice as long on the event loop as one
    into zeros (0.33 ms against 0.15 at the median). Without the pauses once late, every
    segment but a new store's first was zero-filled, and the sends went 8-10 % faster."""
    return 0.0 if writer_at >= DONE_BY else FILL_PAUSE


class _Pace:
    """What one fill knows of its own speed and of the writer's, for `step_due`."""

    __slots__ = ("busy", "recent", "sample", "started")

    def __init__(self, now: float, writer_at: float) -> None:
        self.started = self.sample = (now, writer_at)
        self.recent: float | None = None  # the rate over the last RECENT seconds or more
        self.busy = 0.0  # seconds spent in steps and their pauses

    def writer_rate(self, now: float, writer_at: float) -> float:
        """The writer's rate: 0.0 if it stood still over the last RECENT seconds or more
        (or, in the fill's first RECENT seconds, since it began), else the greater of its
        rate since the fill began and that recent one (a burst after a lull is seen at once)."""
        (began, began_at), (sampled, sampled_at) = self.started, self.sample
        if now - sampled >= RECENT:
            self.recent = (writer_at - sampled_at) / (now - sampled)
            self.sample = (now, writer_at)
        if self.recent is None:
            return (writer_at - began_at) / (now - began) if now > began else 1.0
        if self.recent <= 0.0:
            return 0.0
        return max(self.recent, (writer_at - began_at) / (now - began))

    def stepped(self, seconds: float) -> None:
        self.busy += seconds


def torn_write(damage: records.Damage, zeros: int | None) -> bool:
    """Whether `damage` to the last file of its kind is a write that a crash cut short:
    nothing good after it, or, in a segment zero-filled ahead whose zeros begin at
    `zeros`, within the span of its last synced write."""
    return damage.torn_tail or (zeros is not None and zeros - damage.offset <= WRITE_SPAN)


def until_torn_write(scan: records.Scan, zeros: int | None) -> Iterator[tuple[int, int, int, int]]:
    """The records `scan` finds before a torn write (`torn_write`): what follows one is
    what is left of it, never acknowledged."""
    for record in scan:
        if scan.damages and torn_write(scan.damages[-1], zeros):
            return
        yield record


def split_damage(
    damages: list[records.Damage], zeros: int | None, last: bool
) -> tuple[list[records.Damage], records.Damage | None]:
    """A file's damage before its torn write, and that torn write (None if it has none).

    Only the last file of its kind may have one (`torn_write`), and what lies after it is
    what is left of that write, never acknowledged: recovery truncates there, `verify`
    reports it as the torn tail. The damage before it is damage either way."""
    for index, damage in enumerate(damages):
        if last and torn_write(damage, zeros):
            return damages[:index], damage
    return damages, None


class _Abandoned(Exception):
    """The segment being filled is no longer wanted."""


class Preparer:
    """Keeps the next data segment zero-filled and synced, ready for the writer to take."""

    def __init__(self, directory: Path, segment_bytes: int, progress: Callable[[int], float]) -> None:
        self._directory = directory
        self._size = segment_bytes
        # How far writes are through the segment before `number` (1.0: they need it now).
        self._progress = progress
        self._cond = threading.Condition()
        self._wanted: int | None = None
        self._preparing: int | None = None
        self._ready: tuple[int, int] | None = None  # (number, descriptor)
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name=f"kiteq-store-preparer:{directory}", daemon=True
        )
        self._thread.start()

    def request(self, number: int) -> None:
        """Prepare segment `number` next, instead of whatever else (writer thread)."""
        with self._cond:
            if number == self._preparing or (self._ready is not None and self._ready[0] == number):
                return
            self._wanted = number
            self._cond.notify()

    @property
    def ready(self) -> int | None:
        """The number of the segment prepared and waiting to be taken, if any."""
        ready = self._ready
        return None if ready is None else ready[0]

    def take(self, number: int) -> int | None:
        """The descriptor of segment `number`, renamed into place (the caller syncs the
        directory before anyone relies on it), if it is ready; else None."""
        with self._cond:
            if self._ready is None or self._ready[0] != number:
                return None
            fd = self._ready[1]
            self._ready = None
        final = layout.path_of(self._directory, layout.SEGMENT, number)
        try:
            os.rename(layout.temporary_of(final), final)
        except OSError as exc:
            log.warning("store.preallocation_failed", segment=number, error=str(exc))
            self._discard(number, fd)
            return None
        return fd

    def stop(self) -> None:
        """End the thread and delete what it prepared that nobody took."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        if self._ready is not None:
            self._discard(*self._ready)
            self._ready = None

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._wanted is None and not self._stopping:
                    self._cond.wait()
                number = self._wanted
                if self._stopping or number is None:
                    return
                self._preparing, self._wanted = number, None
                if self._ready is not None:
                    self._discard(*self._ready)
                    self._ready = None
            fd = self._prepare(number)
            with self._cond:
                self._preparing = None
                if fd is None:
                    continue
                if self._wanted is None and not self._stopping:
                    self._ready = (number, fd)
                    continue
            self._discard(number, fd)

    def _prepare(self, number: int) -> int | None:
        """Write segment `number` zero-filled under its `.tmp` name; its descriptor, or None
        if it was abandoned or failed (logged: the writer then appends, as without)."""
        path = layout.temporary_of(layout.path_of(self._directory, layout.SEGMENT, number))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            log.warning("store.preallocation_failed", segment=number, error=str(exc))
            return None
        try:
            offset = layout.write_all(
                fd, [layout.file_head(layout.SEGMENT, number, layout.ZERO_FILLED_VERSION)], 0
            )
            pace = _Pace(time.monotonic(), self._progress(number))
            while offset < self._size:
                self._keep_pace(number, offset, pace)
                if self._wanted is not None or self._stopping:
                    raise _Abandoned
                started = time.monotonic()
                step_end = min(self._size, (offset // FILL_STEP + 1) * FILL_STEP)
                offset += os.pwrite(fd, _ZEROS[: step_end - offset], offset)
                os.fdatasync(fd)
                time.sleep(pause_after_step(self._progress(number)))
                pace.stepped(time.monotonic() - started)
        except _Abandoned:
            self._discard(number, fd)
            return None
        except OSError as exc:
            log.warning("store.preallocation_failed", segment=number, error=str(exc))
            self._discard(number, fd)
            return None
        return fd

    def _keep_pace(self, number: int, offset: int, pace: _Pace) -> None:
        """Return once the fill of `number`, `offset` bytes in, is to take its next step
        (`step_due`), or it is no longer wanted."""
        with self._cond:
            while self._wanted is None and not self._stopping:
                now = time.monotonic()
                writer_at = self._progress(number)
                filled = offset / self._size
                fill_rate = filled / pace.busy if pace.busy else 0.0
                if step_due(writer_at, pace.writer_rate(now, writer_at), filled, fill_rate):
                    return
                self._cond.wait(PACE_CHECK)

    def _discard(self, number: int, fd: int) -> None:
        """Close and delete a prepared segment nobody will take (a leftover is deleted at start)."""
        path = layout.temporary_of(layout.path_of(self._directory, layout.SEGMENT, number))
        try:
            os.close(fd)
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("store.preallocation_not_deleted", segment=number, error=str(exc))
