"""Group commit: one writer thread appends whole batches and fsyncs once per batch.

Calls on the Trio thread reserve a place (segment, offset) for their record and add
it to the *open* batch; that costs a lock and a list append, no syscall. The writer
thread takes the open batch (a fresh one opens at once), writes its data records
with one pwritev per segment and its log records with one pwritev, syncs the data
then the log if any caller in the batch waits for durability (each write with
RWF_DSYNC when its file holds nothing else unsynced, else an fdatasync after the
writes), and hands the batch back to Trio (`TrioToken.run_sync_soon`), which sets
the batch's event: every caller in it wakes together. While a batch is being
written the next one fills up, so the busier the store, the more saves share each
fsync. A batch is due when a caller waits on it (`Batch.wait` -> `flush`); while
the writer sleeps, the caller writes it in place once nothing else is ready on the
Trio thread, sparing two thread hand-offs: a lone caller at once, one beside ready
tasks after they ran (or, if the loop stays busy for `idle.IDLE_GRACE`, the writer takes it),
one whose sender trickles more saves in (paced) after GATHER_DELAY, so they share its sync.

A batch holding only lazily logged changes (nobody waits on it) is written
LAZY_WRITE_DELAY after its first record, or with the next save if one comes first.
The writer owns every write descriptor; a dedicated thread (not a Trio task) keeps
writing even while no Trio task waits, so those changes reach the OS within that
delay, and a cancelled caller never leaves a half-written batch behind.

A write or fsync error fails the store for good (`failure`): after a failed fsync
the kernel may have dropped the dirty pages, so retrying would claim durability it
does not have. Restarting recovers from what is on disk.

A disk that stalls (a write or fsync that does not return) fails the callers waiting
on it after STALL_TIMEOUT with StoreStalled, so a producer is told to resend instead of
waiting for ever; their records are still written once the disk comes back (a resend is
then a duplicate, stored once). A watchdog thread notices the stall: bounding each wait
with a Trio cancel scope of its own cost a few per cent of the broker's CPU per message.
"""

from __future__ import annotations

import enum
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog
import trio

from stores import idle
from stores.base import nothing_coming
from stores.errors import StoreStalled, StoreUnavailable
from stores.file import layout
from stores.file import snapshot as snapshots
from stores.file import summary as summaries
from stores.file.preallocation import WRITE_SPAN, Preparer
from stores.file.segment import Segment
from stores.file.slow_writes import SlowWriteBudget

log = structlog.get_logger(__name__)

# How long a batch of lazily logged changes (finish, update_delivery) may wait for a save
# to write it with. A crash of the process in between loses them: messages are then
# delivered again (at-least-once), never lost.
LAZY_WRITE_DELAY = 0.005
# How long a save whose sender trickles its messages in (`Batch.wait`'s `trickling`) and has
# more on their way is held on the event loop for them to join its batch: paced at 5,000
# messages a second, a sync for every one or two saves kept the disk's queue (a VM exit
# each on this project's machines) busy enough to slow the whole machine's processes.
GATHER_DELAY = 0.001
# Pauses of writes in place (slow_writes.py) this long or longer are logged: the disk stalls.
LOGGED_PAUSE = 1.0
# Callers have waited this long with no batch finished: the disk stalls, they are failed.
STALL_TIMEOUT = 10.0
# How often the watchdog looks (a tenth of the timeout, at most a second).
STALL_CHECKS_PER_TIMEOUT = 10
# Linux 4.7 and later; elsewhere every synced write is a write and then an fdatasync.
RWF_DSYNC: int = getattr(os, "RWF_DSYNC", 0)


class FsyncMode(enum.StrEnum):
    """When a call's records are fsynced before it returns (see docs/file-store.md)."""

    ALWAYS = "always"
    BATCH = "batch"
    NEVER = "never"


class Batch:
    """Records that go to disk together, and the event their callers wait on."""

    __slots__ = (
        "data",
        "done",
        "durable",
        "end",
        "error",
        "gathered",
        "held",
        "log",
        "log_durable",
        "log_generation",
        "reclaim",
        "seq",
        "snapshot",
        "stalled",
        "synced",
        "touched_at",
        "writer",
    )

    def __init__(self, seq: int, log_generation: int, writer: Writer) -> None:
        self.writer = writer
        self.seq = seq
        self.log_generation = log_generation
        self.data: list[tuple[Segment, int, list[bytes]]] = []
        self.log: list[bytes] = []
        self.reclaim: list[Segment] = []
        self.snapshot: snapshots.Snapshot | None = None
        self.durable = False
        # Whether its log records must be synced too: lazily logged changes riding along
        # with a durable save need not, so that save costs one fsync, not two.
        self.log_durable = False
        self.synced = False
        self.touched_at = 0.0
        self.end: tuple[int, int] | None = None
        self.done = trio.Event()
        # Whether a caller holds it for more saves to join (`_gather`; the writer thread
        # leaves it alone meanwhile), and whether one did.
        self.held = False
        self.gathered = False
        self.error: StoreUnavailable | None = None
        # Set when its waiters were failed because the disk stalled; cleared once written.
        self.stalled: StoreStalled | None = None

    @property
    def empty(self) -> bool:
        return not (self.data or self.log or self.reclaim or self.durable or self.snapshot)

    async def wait(
        self, *, checkpoint: bool = True, busy: Callable[[], bool] = nothing_coming, trickling: bool = False
    ) -> None:
        """Return once the batch is written (and fsynced if it had to be); raise if that failed.

        Asking for it has it written (`Writer.flush`: in place when the store is idle and
        `busy()`, asked right then, says no more work is on its way); `checkpoint=False`
        then returns without yielding, for a caller whose every turn of the event loop
        shows in a round trip. A caller whose sender has more on its way but sends it
        spaced out (`trickling`: its messages come a few to a read) has the batch held a
        moment for them instead (`_gather`), then written in place.

        If it could be written in place but other tasks are ready to run (deliveries of
        the messages it holds, say), they run first: it is written once the loop has
        nothing else to do, or by the writer thread after `idle.IDLE_GRACE`. Handed to the
        writer thread at once, it cost a thread hand-off per batch at moderate load, and
        the two threads' turns at the GIL showed in every delivery's latency (messages
        paced at 5,000 a second, end to end: p50 0.87-0.97 ms against 1.00-1.08 ms).
        """
        yielded = False
        if not self.done.is_set():
            lone = not busy()
            if not lone and trickling and (self.gathered or self.writer.in_place_allowed(self)):
                yielded = True
                await self._gather()
            elif lone and self.writer.in_place_once_idle(self):
                yielded = True
                try:
                    await idle.once_others_ran()
                finally:
                    if not self.done.is_set():
                        self.writer.flush(self, in_place=not busy())  # asked anew: the others ran
            else:
                self.writer.flush(self, in_place=lone)
        if self.done.is_set():
            if checkpoint and not yielded:
                await trio.lowlevel.checkpoint()
        else:
            await self.writer.wait_written(self)
        if self.error is not None:
            raise self.error
        if self.stalled is not None:
            raise self.stalled

    async def _gather(self) -> None:
        """Hold the batch `gather_delay` for more saves to join it, then have it written: in
        place once the loop is idle, as a lone save's. Only its first such caller holds it
        (one timer per batch); the others wait for it to be written. Written meanwhile (a
        lone save's caller writes it at once), it is not held any longer."""
        if self.gathered:
            return
        self.gathered = self.held = True
        try:
            with trio.move_on_after(self.writer.gather_delay):
                await self.done.wait()
            self.held = False
            if not self.done.is_set() and self.writer.in_place_once_idle(self):
                await idle.once_others_ran()
        finally:
            self.held = False
            if not self.done.is_set():
                self.writer.flush(self)  # cancelled too: its other callers wait on it


class Writer:
    """The write side of one store: reservations on the Trio thread, I/O on its own thread."""

    def __init__(
        self,
        directory: Path,
        mode: FsyncMode,
        segment_bytes: int,
        segment: Segment,
        data_end: int,
        log_generation: int,
        log_fd: int | None,
        log_size: int,
        on_done: Callable[[list[Batch]], None],
        on_compacted: Callable[[int, int | BaseException, float], None],
        *,
        in_place: bool = True,
        preallocate: bool = True,
        drop_sealed: bool = True,
    ) -> None:
        self.directory = directory
        # Whether a sealed segment's pages are dropped from the page cache (`layout.drop_cached`).
        self.drop_sealed = drop_sealed
        self.mode = mode
        self.segment_bytes = segment_bytes
        self._on_done = on_done
        self._on_compacted = on_compacted
        self._token = trio.lowlevel.current_trio_token()
        # A plain lock, entered directly on the hot path: an RLock-backed Condition costs
        # two Python-level calls per record.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Held by whoever writes batches: the writer thread, or the Trio thread in `flush`.
        self._io = threading.Lock()
        # Whether a waited-on batch may be written on the Trio thread (`flush`); off, every
        # batch goes through the writer thread (the store's `write_in_place` option).
        self.in_place = in_place
        self.gather_delay = GATHER_DELAY  # an attribute, so a test can lengthen it
        self._sleeping = False
        self._sleep_timed = False  # it wakes by itself within LAZY_WRITE_DELAY
        self._stopping = False
        # How much of the loop's time slow writes in place have taken: spent, they pause.
        self.slow_writes = SlowWriteBudget()
        self.stall_timeout = STALL_TIMEOUT
        # Batches someone waits on (Trio side), and when a batch last finished (either side).
        self._waited: set[Batch] = set()
        self._progress_at = time.monotonic()
        self._stall_reported = False
        # Set once the writer stops: ends the watchdog.
        self._closing = threading.Event()
        self._cut: list[Batch] = []
        self._seq = 1
        # Trio side: where the next record goes, what is written and synced.
        self.segment = segment
        self.end = data_end
        self.log_generation = log_generation
        self._open = self._new_batch(log_generation)
        self.written: tuple[int, int] = (segment.number, data_end)
        self.dirty_seq = 0
        self.synced_seq = 0
        # Writer thread side. The files it continues may hold writes an earlier run never
        # synced, so they count as dirty until the first full fdatasync (see _write_range).
        self._active: Segment | None = segment if segment.fd is not None else None
        # Where the active segment's records end, if it was zero-filled ahead: the zeros
        # after are cut off when it is sealed or the store closes. None: it appends.
        self._zero_filled_end: int | None = None
        self._data_dirty = True
        self._log_generation = log_generation
        self._log_fd = log_fd
        self._log_dirty = True
        self._dir_dirty = False
        self.log_size = log_size
        self.failure: StoreUnavailable | None = None
        self.fsyncs = 0
        self.batches = 0
        self.zero_filled_segments = 0
        self.batched_records = 0
        self._preparer: Preparer | None = None
        # Only where every write into a segment is synced before the next (preallocation.py).
        if preallocate and mode is not FsyncMode.NEVER and RWF_DSYNC:
            self._preparer = Preparer(directory, segment_bytes, self._progress_toward)
            self._preparer.request(segment.number + 1)
        # Not `_thread`: compiled, the attribute's C name would be `__thread`, a C keyword.
        self._worker = threading.Thread(target=self._run, name=f"kiteq-store-writer:{directory}", daemon=True)
        self._compactor: threading.Thread | None = None
        self._summarizers: list[threading.Thread] = []
        self._watchdog = threading.Thread(
            target=self._watch, name=f"kiteq-store-watchdog:{directory}", daemon=True
        )
        self._worker.start()
        self._watchdog.start()

    # -- Trio side ------------------------------------------------------------------------

    def append_message(self, record: bytes, head: bytes, *, durable: bool) -> tuple[Segment, int, Batch]:
        """Reserve the next place in the data segments for `record`, whose MESSAGE payload
        starts with `head` (for the segment's summary); the batch that writes it."""
        with self._lock:
            full = self.end + len(record) > self.segment_bytes
            if self.end > layout.HEAD_SIZE and (full or (self.appending and self.next_segment_ready)):
                number = self.segment.number + 1
                self.segment = Segment(number, layout.path_of(self.directory, layout.SEGMENT, number))
                self.end = layout.HEAD_SIZE
            segment, offset = self.segment, self.end
            self.end += len(record)
            if segment.summary is not None:
                segment.summary.add(offset, len(record), head)
            batch = self._open
            data = batch.data
            if data and data[-1][0] is segment:
                data[-1][2].append(record)
            else:
                data.append((segment, offset, [record]))
            batch.end = (segment.number, self.end)
            self._touch(batch, durable)
        return segment, offset, batch

    def append_ops(self, records: list[bytes], *, durable: bool) -> Batch:
        """Queue operation-log records (under one lock, however many); the batch that writes them."""
        with self._lock:
            batch = self._open
            batch.log.extend(records)
            batch.log_durable = batch.log_durable or durable
            self._touch(batch, durable)
        return batch

    def sync(self) -> Batch:
        """A batch that fsyncs (per the mode) everything appended so far."""
        with self._lock:
            batch = self._open
            batch.log_durable = True
            self._touch(batch, True)
        return batch

    def reclaim(self, segment: Segment) -> None:
        """Delete an emptied segment once the ops that emptied it are on disk."""
        with self._lock:
            self._open.reclaim.append(segment)
            self._touch(self._open, False)

    def cut(self, snapshot: snapshots.Snapshot) -> None:
        """End the log generation here; write `snapshot` once everything before the cut is synced."""
        with self._lock:
            batch = self._open
            batch.snapshot = snapshot
            batch.log_durable = True
            self._touch(batch, True)
            self._cut.append(batch)
            if self._sleeping:
                self._cond.notify()
            self._seq += 1
            self.log_generation = snapshot.generation
            self._open = self._new_batch(snapshot.generation)

    def _new_batch(self, log_generation: int) -> Batch:
        return Batch(self._seq, log_generation, self)

    async def wait_written(self, batch: Batch) -> None:
        """Wait until `batch` is written, or the watchdog finds the disk stalled (`stalled`)."""
        if not self._waited:
            self._progress_at = time.monotonic()  # a stall is timed from the first wait
        self._waited.add(batch)
        await batch.done.wait()

    def in_place_once_idle(self, batch: Batch) -> bool:
        """Whether `flush` would write `batch` in place, but for the tasks ready to run."""
        return self.in_place_allowed(batch) and idle.others_ready()

    def in_place_allowed(self, batch: Batch) -> bool:
        """Whether `batch` may be written on the Trio thread, whatever else is ready to run:
        it is the open one, the writer sleeps with nothing cut, and slow writes in place
        have not spent their budget."""
        return (
            self.in_place
            and batch is self._open
            and self._sleeping
            and not self._cut
            and not self._stopping
            and not self._changes_files(batch)
            and self.slow_writes.allows(time.monotonic())
        )

    def _changes_files(self, batch: Batch) -> bool:
        """Whether writing `batch` seals or opens a segment, starts a log or deletes files.

        That takes the file system's journal (a rename, a directory fsync, a truncation):
        4-7 ms on the Trio thread at each change of segment, while every message on the
        broker waited. The writer thread does it instead: only the saves in the batch wait."""
        if batch.reclaim or self._dir_dirty:
            return True
        if batch.log and (batch.log_generation != self._log_generation or self._log_fd is None):
            return True
        return any(segment is not self._active for segment, _, _ in batch.data)

    def flush(self, batch: Batch, *, in_place: bool = True) -> None:
        """A caller waits on `batch` (Batch.wait): have it written now.

        While nothing else is ready to run on the Trio thread, the writer sleeps with
        nothing else queued, and the caller's sender has nothing more on its way
        (`in_place`), it is written right here: waking the writer thread and being woken
        back are two thread hand-offs and a dozen futex calls, a good part of a lone
        save's round trip (a producer awaiting each store-ack: about 1.2x the rate).
        Otherwise (under load, out of turn, or with more on its way) the writer thread is
        woken, and batches fill while it writes. With more on its way, a write here would
        hold that work up for the sync: a producer keeping sends in flight at 5,000/s had
        its messages' p50 / p99 about a sixth / a ninth lower once its saves were not
        written here. Slow writes here are charged to a budget (`slow_writes`): spent, it
        sends batches to the writer thread until it has refilled, so a stalling disk
        holds up the event loop once in a while, never on every save, and the hiccups of
        a busy machine's disk do not cost lone saves their fast path.
        """
        with self._lock:
            inline = (
                in_place
                and self.in_place_allowed(batch)
                and not idle.others_ready()
                and self._io.acquire(blocking=False)
            )
            if not inline:
                if self._sleeping:
                    self._cond.notify()
                return
            self._seq += 1
            self._open = self._new_batch(self.log_generation)
        started = time.monotonic()
        try:
            self._process(batch)
        finally:
            self._io.release()
        ended = time.monotonic()
        took = ended - started
        pause = self.slow_writes.charge(took, ended)
        if pause >= LOGGED_PAUSE:
            log.warning(
                "store.slow_write",
                store=str(self.directory),
                seconds=round(took, 4),
                detail=f"batches go through the writer thread for the next {pause:.3g} s",
            )
        self._finished([batch])

    @property
    def appending(self) -> bool:
        """Whether the segment being written appends (it was not zero-filled ahead: the one
        a start continues or creates, or one whose successor was not ready in time). Such
        a segment is left for the next as soon as that is ready (`append_message`): a new
        or restarted store pays an appending write's cost for the second or so the first
        fill takes, not for a whole segment. (Writer-thread state, read from the Trio
        thread and the preparer's: a stale answer costs one more append or check.)"""
        return self._zero_filled_end is None

    @property
    def next_segment_ready(self) -> bool:
        """Whether the segment after the current one is zero-filled and ready (preallocation.py)."""
        return self._preparer is not None and self._preparer.ready == self.segment.number + 1

    def _progress_toward(self, number: int) -> float:
        """How far writes are through the segment before `number`, 0.0 to 1.0 (read by the
        preparer's thread): 1.0 once they need it, or while they append (`appending`)."""
        if self.appending or self.segment.number >= number:
            return 1.0
        return self.end / self.segment_bytes

    def settled(self) -> bool:
        """True when everything appended so far is as durable as the mode makes it."""
        return self.synced_seq >= self.dirty_seq

    def is_written(self, segment: int, offset: int) -> bool:
        return (segment, offset) < self.written

    def _touch(self, batch: Batch, durable: bool) -> None:
        # A lazy batch's first record wakes the writer, to write it LAZY_WRITE_DELAY later,
        # unless it is to wake by itself before then (`_await_work`); a batch someone must
        # wait on is written when they wait (`flush`).
        first = not batch.touched_at
        if first:
            batch.touched_at = time.monotonic()
        batch.durable = batch.durable or durable
        self.dirty_seq = batch.seq
        if first and not durable and self._sleeping and not self._sleep_timed:
            self._cond.notify()

    def _finished(self, batches: list[Batch]) -> None:
        """On the Trio thread: publish progress and wake every caller of `batches`."""
        self._progress_at = time.monotonic()
        self._stall_reported = False
        for batch in batches:
            if batch.end is not None:
                self.written = max(self.written, batch.end)
            if batch.synced:
                self.synced_seq = max(self.synced_seq, batch.seq)
            batch.stalled = None
            self._waited.discard(batch)
        self._on_done(batches)
        for batch in batches:
            batch.done.set()

    def _fail_stalled(self) -> None:
        """On the Trio thread: the watchdog saw no batch finish for `stall_timeout` while
        callers waited; wake them with StoreStalled (their batches are still written later)."""
        if not self._stall_reported or not self._waited:
            return  # a batch finished since the watchdog looked
        stalled = time.monotonic() - self._progress_at
        error = StoreStalled(
            f"the file store {self.directory} has finished no write for {stalled:.1f} s (a stalled "
            "disk?); what it was writing is stored once the disk answers"
        )
        log.warning(
            "store.stalled", store=str(self.directory), seconds=round(stalled, 1), waiting=len(self._waited)
        )
        with self._lock:
            if self._open in self._waited:  # queued as it is: records from now on go to a fresh one
                self._cut.append(self._open)
                self._seq += 1
                self._open = self._new_batch(self.log_generation)
                if self._sleeping:
                    self._cond.notify()
        for batch in self._waited:
            batch.stalled = error
            batch.done.set()
        self._waited.clear()
        self._stall_reported = False  # callers that wait from now on get a timeout of their own

    async def stop(self) -> None:
        """Write what is pending with an fsync, then end the threads."""
        if self.failure is None:
            batch = self.sync()
            self.flush(batch)
            await batch.done.wait()
        with self._lock:
            self._stopping = True
            self._cond.notify()
        self._closing.set()
        await trio.to_thread.run_sync(self._join)

    def _join(self) -> None:
        self._worker.join()
        self._watchdog.join()
        if self._preparer is not None:
            self._preparer.stop()
        if self.failure is None and self._active is not None:
            try:
                self._cut_zeros(self._active)
            except OSError as exc:  # the next start cuts them: nothing is lost
                log.warning("store.unused_space_not_cut", store=str(self.directory), error=str(exc))
        if self._compactor is not None:
            self._compactor.join()
        for thread in self._summarizers:
            thread.join()
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    # -- writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        written: list[Batch] = []
        while True:
            with self._lock:
                if written and not self._hand_back(written):
                    return
                self._await_work(look_out=bool(written))
                batches, self._cut = self._cut, []
                if not self._open.empty:
                    batches.append(self._open)
                    self._seq += 1
                    self._open = self._new_batch(self.log_generation)
            if not batches:
                return
            with self._io:
                for batch in batches:
                    self._process(batch)
            written = batches

    def _hand_back(self, batches: list[Batch]) -> bool:
        """Have the Trio thread finish `batches` (holding `_lock`); False if the run ended.

        Under the lock until the writer sleeps or takes the next batch, so a caller woken
        by it never finds the writer in between: there, its next lone save went to the
        writer thread instead of being written in place."""
        try:
            self._token.run_sync_soon(self._finished, batches)
        except trio.RunFinishedError:
            log.warning(
                "store.writer_orphaned",
                store=str(self.directory),
                detail="the Trio run ended before the store was closed",
            )
            return False
        return True

    def _watch(self) -> None:
        """The watchdog thread: while callers wait, report a stall once no batch has
        finished for `stall_timeout` (once per stall: progress re-arms it)."""
        while not self._closing.wait(min(1.0, self.stall_timeout / STALL_CHECKS_PER_TIMEOUT)):
            if (
                self._waited
                and not self._stall_reported
                and time.monotonic() - self._progress_at > self.stall_timeout
            ):
                self._stall_reported = True
                try:
                    self._token.run_sync_soon(self._fail_stalled)
                except trio.RunFinishedError:
                    return

    def _await_work(self, *, look_out: bool) -> None:
        """Sleep (holding `_lock`) until a batch is due: at once if a caller waits on it
        (once released, if a caller holds it for more saves: `Batch._gather`), else
        LAZY_WRITE_DELAY after its first record, so lazily logged changes mostly ride
        along with the next save instead of costing a write and a wake-up of their own.

        With `look_out` (it has just written), over an empty batch it first sleeps
        LAZY_WRITE_DELAY, then until woken: while the store is busy, a lazy batch that
        opens meanwhile needs no wake-up of its own (at 5,000 saves a second that was one
        of the writer's two wake-ups per batch), and an idle store's writer sleeps for
        good after one look."""
        while not self._cut and not self._stopping:
            batch = self._open
            if batch.empty:
                timeout = LAZY_WRITE_DELAY if look_out else None
                look_out = False
            elif batch.held:
                timeout = None  # its caller has it written, or wakes this thread, once done
            elif batch.durable:
                return
            else:
                timeout = batch.touched_at + LAZY_WRITE_DELAY - time.monotonic()
                if timeout <= 0:
                    return
            self._sleeping = True
            self._sleep_timed = timeout is not None
            self._cond.wait(timeout)
            self._sleeping = False

    def _process(self, batch: Batch) -> None:
        if self.failure is None:
            try:
                self._write(batch)
                return
            except OSError as exc:
                self.failure = StoreUnavailable(
                    f"writing the file store {self.directory} failed ({exc}); it accepts no more writes "
                    "— free disk space or fix the device, then restart to recover from what is on disk"
                )
                log.error("store.write_failed", store=str(self.directory), error=str(exc))
        batch.error = self.failure
        if batch.snapshot is not None and batch.snapshot.child is not None:
            batch.snapshot.child.kill()  # no compactor will install what it writes

    def _write(self, batch: Batch) -> None:
        records = 0
        must_sync = self.mode is FsyncMode.ALWAYS or (batch.durable and self.mode is FsyncMode.BATCH)
        sync_log = must_sync and (batch.log_durable or self.mode is FsyncMode.ALWAYS)
        for segment, start, chunks in batch.data:
            if segment is not self._active:
                self._seal()
                if segment.fd is None:
                    self._open_segment(segment)
                self._active = segment
            assert segment.fd is not None
            span = WRITE_SPAN if self._zero_filled_end is not None else 0
            written, self._data_dirty = _write_range(
                segment.fd, chunks, start, must_sync, self._data_dirty, span
            )
            if self._zero_filled_end is not None:
                self._zero_filled_end = max(self._zero_filled_end, start + written)
            records += len(chunks)
        if batch.log:
            if batch.log_generation != self._log_generation or self._log_fd is None:
                self._switch_log(batch.log_generation)
            assert self._log_fd is not None
            written, self._log_dirty = _write_range(
                self._log_fd, batch.log, self.log_size, sync_log, self._log_dirty
            )
            self.log_size += written
            records += len(batch.log)
        if must_sync or batch.snapshot is not None:
            self._sync(log=sync_log or batch.snapshot is not None)
        batch.synced = self.mode is FsyncMode.NEVER or not (self._data_dirty or self._log_dirty)
        if batch.reclaim:
            self._delete(batch.reclaim)
        if batch.snapshot is not None:
            # Later ops go to the new generation's log, which starts empty now.
            self._switch_log(batch.snapshot.generation)
            self._compactor = threading.Thread(
                target=self._compact,
                args=(batch.snapshot,),
                name=f"kiteq-store-compactor:{self.directory}",
                daemon=True,
            )
            self._compactor.start()
        self.batches += 1
        self.batched_records += records

    def _sync(self, *, log: bool = True) -> None:
        """fsync data before log: a durable op never refers to a record that is not.
        `log=False` leaves lazily logged changes to a later sync."""
        if self._data_dirty and self._active is not None and self._active.fd is not None:
            os.fdatasync(self._active.fd)
            self._data_dirty = False
        if log and self._log_dirty and self._log_fd is not None:
            os.fdatasync(self._log_fd)
            self._log_dirty = False
        if self._dir_dirty:
            layout.fsync_dir(self.directory)
            self._dir_dirty = False
        self.fsyncs += 1

    def _open_segment(self, segment: Segment) -> None:
        """Start the next segment: the one zero-filled ahead, if ready, else a new file;
        and have the one after it prepared."""
        fd = self._preparer.take(segment.number) if self._preparer is not None else None
        if fd is not None:
            segment.fd = fd
            self._zero_filled_end = layout.HEAD_SIZE
            self.zero_filled_segments += 1
        else:
            segment.create()
            self._data_dirty = True  # its header is written, not synced
        self._dir_dirty = True
        if self._preparer is not None:
            self._preparer.request(segment.number + 1)

    def _cut_zeros(self, segment: Segment) -> None:
        """Cut a zero-filled segment's unused zeros off (it is sealed, or the store closes):
        a sealed segment, like an appended one, ends where its records do."""
        if self._zero_filled_end is not None and segment.fd is not None:
            os.ftruncate(segment.fd, self._zero_filled_end)
            self._data_dirty = True
        self._zero_filled_end = None
        if self._data_dirty and segment.fd is not None:
            os.fdatasync(segment.fd)
        self._data_dirty = False

    def _seal(self) -> None:
        """A segment the writer leaves is fsynced in every mode: only the last may have a torn tail.
        Then its summary is written and its pages dropped from the page cache (unless
        `drop_sealed` is off), on a thread of its own (see summary.py)."""
        sealed = self._active
        if sealed is not None:
            self._cut_zeros(sealed)
        self._data_dirty = False
        if sealed is not None and (sealed.summary is not None or self.drop_sealed):
            built, sealed.summary = sealed.summary, None
            self._summarizers = [thread for thread in self._summarizers if thread.is_alive()]
            thread = threading.Thread(
                target=self._after_seal,
                args=(sealed.number, built),
                name=f"kiteq-store-summary:{sealed.number}",
                daemon=True,
            )
            self._summarizers.append(thread)
            thread.start()

    def _after_seal(self, number: int, built: summaries.Summary | None) -> None:
        """A sealed segment's thread: write its summary, if it has one, then drop its pages."""
        if built is not None:
            self._summarize(number, built)
        if self.drop_sealed:
            try:
                layout.drop_cached(layout.path_of(self.directory, layout.SEGMENT, number))
            except OSError as exc:  # its pages stay cached: nothing else changes
                log.warning("store.cache_not_dropped", segment=number, error=str(exc))

    def _summarize(self, number: int, built: summaries.Summary) -> None:
        """Write segment `number`'s summary."""
        try:
            summaries.write(self.directory, number, built)
        except FileNotFoundError:
            pass  # the segment was reclaimed already: no summary is wanted
        except OSError as exc:
            # Recovery reads the segment instead: slower, nothing lost.
            log.warning("store.summary_not_written", segment=number, error=str(exc))

    def _switch_log(self, generation: int) -> None:
        if self._log_fd is not None:
            if self._log_dirty:
                os.fdatasync(self._log_fd)
                self._log_dirty = False
            os.close(self._log_fd)
        path = layout.path_of(self.directory, layout.LOG, generation)
        self._log_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.log_size = layout.write_all(self._log_fd, [layout.file_head(layout.LOG, generation)], 0)
        self._log_generation = generation
        self._log_dirty = True  # its header is written, not synced
        self._dir_dirty = True

    def _delete(self, segments: list[Segment]) -> None:
        if self.mode is not FsyncMode.NEVER and self._log_dirty:
            self._sync()
        for segment in segments:
            segment.unlink(missing_ok=True)

    def _compact(self, snapshot: snapshots.Snapshot) -> None:
        """The compactor thread: once the cut is synced, the snapshot is written (by its child
        process, or here) and installed."""
        started = time.perf_counter()
        result: int | BaseException
        try:
            if snapshot.child is not None:
                result = snapshot.child.wait()
            else:
                result = snapshots.write_temporary(self.directory, snapshot)
            snapshots.install(self.directory, snapshot.generation)
        except OSError as exc:
            result = exc
        try:
            self._token.run_sync_soon(
                self._on_compacted, snapshot.generation, result, time.perf_counter() - started
            )
        except trio.RunFinishedError:
            return


def _write_range(
    fd: int, chunks: list[bytes], offset: int, sync: bool, dirty: bool, span: int = 0
) -> tuple[int, bool]:
    """Write `chunks` at `offset`: (bytes written, whether the file now holds unsynced writes).

    A write that must be synced, to a file with nothing else unsynced, is one pwritev with
    RWF_DSYNC: a syscall, and a round of the GIL between this thread and Trio's, fewer
    than a write and then an fdatasync. After unsynced writes it stays a plain write
    (RWF_DSYNC syncs only its own range), and `_sync` fdatasyncs the whole file.
    `span` bounds the bytes of one synced write (into zero-filled space: preallocation.py).
    """
    if sync and not dirty and RWF_DSYNC:
        return layout.write_all(fd, chunks, offset, RWF_DSYNC, span=span), False
    return layout.write_all(fd, chunks, offset), True
