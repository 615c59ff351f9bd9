"""`file:///path/dir` — segmented append-only files of TLV records, with group commit.

Layout (see layout.py): data segments hold MESSAGE records (the whole entity as
saved); the operation log holds every later state change (commit, rollback,
delivery result, finish, dead-letter, redrive, purge), each naming the record it
changes; snapshots let the log start over. In memory there is only the index
(index.py): id -> (segment, offset, state). Bodies are read from disk by `get`
and the pages, through a small LRU of recent payloads.

Durability, by `fsync` mode (default batch). Every call that waits returns only
after its records were handed to the OS by the writer thread, so a crash of the
*process* (SIGKILL, OOM) loses nothing any call returned for; the modes differ
in what survives a crash of the *machine* (power loss, kernel panic):

- `always`: every call that changes state returns after an fsync covering it
  (concurrent calls still share one fsync). A machine crash loses nothing returned.
- `batch`: `save`, `commit`, `rollback`, `dead_letter`, `redrive` and `purge`
  return after the shared fsync of their batch (group commit). `update_delivery`
  and `finish` return at once and are written with the next batch (within 5 ms) and fsynced
  with the next durable one: a machine crash can lose the last of them, so a
  message may be delivered again (at-least-once holds) or a finished message
  come back (to be finished again).
- `never`: nothing is fsynced except when a segment is sealed, at compaction and
  at close. A machine crash can lose recent saves and changes, and may leave
  damage mid-file that needs `?repair=true`.

What a crash leaves is repaired at start (recovery.py): a torn tail of the last
segment or log is truncated; damage anywhere else stops the store with
StoreCorrupted unless `repair=true`.

Space: a data segment in which no message is live or dead any more (all finished,
rolled back or purged) is deleted once the ops that emptied it are on disk, with
its summary; the log is compacted into a snapshot when it outgrows both
`compact_bytes` and the index's size. Only one process may open a directory (LOCK, flock).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Container, Iterable, Sequence
from pathlib import Path
from typing import Any, Self

import structlog
import trio

from stores.base import (
    Cursor,
    DeadLetter,
    DeliveryUpdate,
    MessageStore,
    Page,
    Stage,
    Staged,
    StoreStats,
    nothing_coming,
)
from stores.entity import MessageEntity
from stores.errors import StoreError, StoreUnavailable
from stores.file import forked, layout, records
from stores.file.cache import PayloadCache
from stores.file.index import Index, location, same_record, unpack
from stores.file.lock import DirectoryLock
from stores.file.messages import decode_message, encode_message, flags_of, head_of
from stores.file.ops import Op, encode_op
from stores.file.options import FileStoreOptions, parse_uri
from stores.file.records import RecordType
from stores.file.recovery import Recovered, recover
from stores.file.segment import Segment, read_runs
from stores.file.snapshot import Snapshot, write_temporary
from stores.file.writer import Batch, FsyncMode, Writer
from stores.schedule import PROMOTE_STEP

log = structlog.get_logger(__name__)

# Decisions: durable when they return in batch mode. The others are logged lazily.
DECISIONS = frozenset(
    {
        RecordType.COMMIT,
        RecordType.ROLLBACK,
        RecordType.DEAD,
        RecordType.REDRIVE,
        RecordType.PURGE,
        RecordType.CANCEL,
    }
)
REMOVALS = frozenset({RecordType.ROLLBACK, RecordType.FINISH, RecordType.PURGE, RecordType.CANCEL})
# A page's entities are decoded in bursts of this many, with the other ready tasks run in
# between: a page of 500 decoded in one go held up acks and deliveries for milliseconds.
DECODE_BURST = 64
# Log bytes per live entry a snapshot costs about (id, packed entry, framing).
SNAPSHOT_BYTES_PER_ENTRY = 96


class FileStore(MessageStore):
    """The durable store of a single broker; see the module docstring."""

    durable = True
    stages_at_once = True  # stage_many never yields

    def __init__(self, directory: Path, options: FileStoreOptions | None = None, *, uri: str = "") -> None:
        self.directory = Path(directory)
        self.options = options or FileStoreOptions()
        self.uri = uri or f"file://{self.directory}"
        self._lock = DirectoryLock(self.directory)
        self._index = Index()
        self._segments: dict[int, Segment] = {}
        self._writer: Writer | None = None
        self._recovered: Recovered | None = None
        self._cache = PayloadCache(self.options.cache_bytes)
        self._state = "new"
        self._compaction_pending = False
        self._compaction_done = trio.Event()
        self._snapshot_mark = (0, 0)
        self._compactions = 0
        self._reclaimed = 0
        self._log = log.bind(store=str(self.directory))

    @classmethod
    def from_uri(cls, uri: str, **options: Any) -> Self:
        """`file:///dir?fsync=batch&segment_bytes=64MiB&repair=false`; keyword options win."""
        directory, parsed = parse_uri(uri, options)
        return cls(directory, parsed, uri=uri)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._state != "new":
            raise StoreError(f"the file store {self.directory} was already started; open a new FileStore")
        options = self.options
        try:
            if options.read_only:
                if not self.directory.is_dir():
                    raise StoreError(f"there is no store at {self.directory}")
            else:
                self.directory.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
        except OSError as exc:
            raise StoreUnavailable(f"cannot open the store directory {self.directory}: {exc}") from exc
        try:
            recovered = await trio.to_thread.run_sync(
                functools.partial(recover, self.directory, repair=options.repair, read_only=options.read_only)
            )
        except BaseException:
            self._lock.release()
            raise
        self._recovered = recovered
        self._snapshot_mark = recovered.high_water
        self._index = recovered.index
        self._segments = recovered.segments
        if not options.read_only:
            self._segments[recovered.current.number] = recovered.current
            self._writer = Writer(
                self.directory,
                options.fsync,
                options.segment_bytes,
                recovered.current,
                recovered.data_end,
                recovered.log_generation,
                recovered.log_fd,
                recovered.log_size,
                self._batches_done,
                self._compacted,
                in_place=options.write_in_place,
                preallocate=options.preallocate,
                drop_sealed=not options.cache_sealed,
            )
        self._state = "open"
        if self._writer is not None and recovered.repaired:
            # What repair kept becomes the new truth at once, so the next start needs no repair.
            self._snapshot(self._writer, "repair")

    async def close(self) -> None:
        """Write what is pending, snapshot the index and let go of the directory.

        Shielded from cancellation: a cancelled caller must not leave the writer
        thread working on closed descriptors.
        """
        if self._state != "open":
            if self._state == "new":
                self._state = "closed"
            await trio.lowlevel.checkpoint()
            return
        self._state = "closing"
        writer = self._writer
        with trio.CancelScope(shield=True):
            try:
                if writer is not None:
                    if self._compaction_pending:
                        await self._compaction_done.wait()
                    if writer.failure is None and (
                        writer.log_size > layout.HEAD_SIZE or self._data_since_snapshot(writer) > 0
                    ):
                        self._snapshot(
                            writer, "close"
                        )  # the next start reads the snapshot, not every segment
                    await writer.stop()
            finally:
                for segment in self._segments.values():
                    segment.close()
                self._lock.release()
                self._state = "closed"

    # -- writes -----------------------------------------------------------------------------

    async def save(self, entity: MessageEntity) -> bool:
        # A new message skips save_many's lists: a producer that saves one message at a
        # time pays for every step of this call. A duplicate takes save_many's path.
        batch = self._append(self._writable(), entity)
        if batch is None:
            return (await self.save_many([entity]))[0]
        await batch.wait()
        return True

    async def save_many(self, entities: Sequence[MessageEntity]) -> list[bool]:
        """Append every new message to the open batch, then wait for the batches that hold them.

        A duplicate waits too: the copy it duplicates may still be in flight.
        """
        staged = await self.stage_many(entities)
        await staged.durable()
        return staged.saved

    async def stage_many(self, entities: Sequence[MessageEntity]) -> Staged:
        """Indexed (and in the write cache) at once; durable when their batches are written.

        Not a checkpoint, nor is `durable()` when the save was written in place: a lone
        save's every turn of the event loop shows in its round trip.
        """
        writer = self._writable()
        answers = [self._append(writer, entity) for entity in entities]
        duplicate = None in answers and not writer.settled()
        batches = [*answers, writer.sync() if duplicate else None]
        return Staged([batch is not None for batch in answers], functools.partial(self._written, batches))

    def _append(self, writer: Writer, entity: MessageEntity) -> Batch | None:
        """Log a new message and index it; the batch that writes it, None for a stored id."""
        message_id = entity.message_id
        if message_id in self._index:
            return None
        payload = encode_message(entity)
        record = records.encode(RecordType.MESSAGE, payload)
        prepared = self._index.prepare(entity, flags_of(payload))
        segment, offset, batch = writer.append_message(record, head_of(payload, 0), durable=True)
        if segment.number not in self._segments:
            self._rotated(segment)
        self._index.add(message_id, segment.number, offset, len(record), entity, prepared)
        self._cache.put(message_id, payload)
        return batch

    async def commit(self, message_id: str, due_at: float = 0.0) -> bool:
        return await self._change(Op(RecordType.COMMIT, message_id, 0, 0, next_deliver_at=due_at))

    async def rollback(self, message_id: str) -> bool:
        return await self._change(Op(RecordType.ROLLBACK, message_id, 0, 0))

    async def update_delivery(
        self,
        message_id: str,
        succ_groups: Iterable[str],
        fail_groups: Iterable[str],
        deliver_count: int,
        next_deliver_at: float,
    ) -> bool:
        return await self._change(
            _delivery_op(message_id, succ_groups, fail_groups, deliver_count, next_deliver_at)
        )

    async def update_delivery_many(self, updates: Sequence[DeliveryUpdate]) -> list[bool]:
        """One append for all; not a checkpoint unless it waits for a write, as `finish_many`."""
        ops = [
            _delivery_op(u.message_id, u.succ_groups, u.fail_groups, u.deliver_count, u.next_deliver_at)
            for u in updates
        ]
        answers, batch = self._apply(self._writable(), ops)
        await self._written((batch,))
        return answers

    async def finish(self, message_id: str) -> bool:
        return await self._change(Op(RecordType.FINISH, message_id, 0, 0))

    async def dead_letter(self, message_id: str, reason: str) -> bool:
        return await self._change(Op(RecordType.DEAD, message_id, 0, 0, reason=reason))

    async def redrive(self, message_id: str) -> bool:
        return await self._change(Op(RecordType.REDRIVE, message_id, 0, 0))

    async def purge(self, message_id: str) -> bool:
        return await self._change(Op(RecordType.PURGE, message_id, 0, 0))

    async def cancel(self, message_id: str) -> bool:
        return await self._change(Op(RecordType.CANCEL, message_id, 0, 0))

    async def dead_letter_many(self, letters: Sequence[DeadLetter]) -> list[bool]:
        """Each letter's final delivery state and its DEAD record in one append and one fsync."""
        ops = []
        for letter in letters:
            ops.append(
                _delivery_op(
                    letter.message_id, letter.succ_groups, letter.fail_groups, letter.deliver_count, letter.at
                )
            )
            ops.append(Op(RecordType.DEAD, letter.message_id, 0, 0, reason=letter.reason))
        answers, batch = self._apply(self._writable(), ops)
        await self._wait_for((batch,))
        return answers[1::2]

    async def finish_many(self, message_ids: Sequence[str]) -> list[bool]:
        """Not a checkpoint unless it waits for a write (`fsync=always`): its caller, the
        broker's outcome recorder, yields just before, and a lone round's outcome would
        otherwise cost a second turn of the event loop."""
        answers, batch = self._apply(self._writable(), [Op(RecordType.FINISH, i, 0, 0) for i in message_ids])
        await self._written((batch,))
        return answers

    async def _change(self, op: Op) -> bool:
        """Apply `op` to the index, log it, and wait as its kind and the fsync mode require."""
        (accepted,), batch = self._apply(self._writable(), [op])
        await self._wait_for((batch,))
        return accepted

    @staticmethod
    async def _wait_for(batches: Iterable[Batch | None]) -> None:
        """Wait for every distinct batch given (None: nothing to wait for)."""
        waited = False
        for batch in _distinct(batches):
            await batch.wait()
            waited = True
        if not waited:
            await trio.lowlevel.checkpoint()

    @staticmethod
    async def _written(
        batches: Iterable[Batch | None], *, busy: Callable[[], bool] = nothing_coming, trickling: bool = False
    ) -> None:
        """Like `_wait_for`, but a checkpoint only when a batch is still being written: for
        callers whose every turn of the event loop shows. `Staged.durable` is one: a lone
        save is written in place (`Writer.flush`), and its store-ack then goes out in the
        same turn as its message came in, unless `busy()` says more is on its way (then,
        `trickling`, its batch is held a moment for them: `Batch.wait`)."""
        for batch in _distinct(batches):
            await batch.wait(checkpoint=False, busy=busy, trickling=trickling)

    def _apply(self, writer: Writer, ops: Sequence[Op]) -> tuple[list[bool], Batch | None]:
        """Apply `ops` to the index and log them with one append: (answers, the batch to wait for).

        The batch is None unless one of them must be durable before it is answered. If
        one fails (an op that cannot be encoded), those before it are still logged: the
        index holds them already.
        """
        answers: list[bool] = []
        logged: list[bytes] = []
        durable = settle = removed = False
        try:
            for op in ops:
                entry = self._index.get(op.message_id)
                if entry is None:
                    answers.append(False)
                    continue
                # Encoded first: if it cannot be, nothing has changed.
                record = records.encode(op.rtype, encode_op(op, entry.segment, entry.offset))
                accepted, changed = self._index.apply(op, entry=entry)
                answers.append(accepted)
                wait = op.rtype in DECISIONS or writer.mode is FsyncMode.ALWAYS
                if changed:
                    logged.append(record)
                    durable = durable or wait
                    if op.rtype in REMOVALS:
                        self._cache.discard(op.message_id)
                        removed = True
                elif accepted and wait:
                    # Nothing new to log, but an earlier change this answer reports may still be in flight.
                    settle = True
        finally:
            batch = writer.append_ops(logged, durable=durable) if logged else None
            if removed:
                self._reclaim_emptied(writer)
        if settle and not writer.settled():
            batch = writer.sync()
        return answers, batch if durable or settle else None

    # -- reads ------------------------------------------------------------------------------

    async def get(self, message_id: str) -> MessageEntity | None:
        self._readable()
        while True:
            entry = self._index.get(message_id)
            if entry is None:
                await trio.lowlevel.checkpoint()
                return None
            payload = self._cache.get(message_id)
            if payload is None:
                (payload,) = await self._read([(entry.segment, entry.offset, entry.length)])
            else:
                await trio.lowlevel.checkpoint()
            now = self._index.get(message_id)
            if now is None:
                return None
            if (now.segment, now.offset) == (entry.segment, entry.offset):
                return self._index.apply_state(decode_message(payload, 0, len(payload)), now)

    async def page_due(
        self,
        now: float,
        after: Cursor | None,
        limit: int,
        skip: Container[str] = frozenset(),
        parked: Collection[str] = frozenset(),
    ) -> Page:
        self._readable()
        while not self._index.promote(now, parked, PROMOTE_STEP):
            await trio.lowlevel.checkpoint()
        return await self._page(self._index.page_due(now, after, _limit(limit) + 1, skip, parked), limit)

    async def next_due_at(self, now: float) -> float | None:
        self._readable()
        return self._index.schedule.next_at()

    async def page_uncommitted(self, older_than: float, after: Cursor | None, limit: int) -> Page:
        self._readable()
        return await self._page(self._index.page_uncommitted(older_than, after, _limit(limit) + 1), limit)

    async def page_dead(self, after: Cursor | None, limit: int) -> Page:
        self._readable()
        return await self._page(self._index.page_dead(after, _limit(limit) + 1), limit)

    async def page_messages(
        self, after: Cursor | None, limit: int, *, topic: str = "", stage: Stage | None = None
    ) -> Page:
        self._readable()
        return await self._page(self._index.page_messages(after, _limit(limit) + 1, topic, stage), limit)

    async def _page(self, ids: list[str], limit: int) -> Page:
        """Load the entities of the first `limit` ids; the cursor is the last id when more follow.

        Entries are kept packed until a message is taken: only its location is read to
        fetch it, and only the entries of what goes into the page are unpacked.
        """
        cursor = ids[limit - 1] if len(ids) > limit else None
        ids = ids[:limit]
        entries = self._index.entries
        packed = {message_id: entries.get(message_id) for message_id in ids}
        payloads = {message_id: self._cache.get(message_id) for message_id in ids}
        missing = [(mid, raw) for mid, raw in packed.items() if raw is not None and payloads[mid] is None]
        if missing:
            read = await self._read([location(raw) for _, raw in missing])
            payloads.update(zip((message_id for message_id, _ in missing), read, strict=True))
        else:
            await trio.lowlevel.checkpoint()
        items = []
        for decoded, (message_id, raw) in enumerate(packed.items(), 1):
            if decoded % DECODE_BURST == 0:
                await trio.lowlevel.checkpoint()  # each entry is checked anew below
            now = entries.get(message_id)
            payload = payloads[message_id]
            if raw is None or now is None or payload is None or not same_record(now, raw):
                continue  # finished or replaced while the page was read
            items.append(self._index.apply_state(decode_message(payload, 0, len(payload)), unpack(now)))
        return Page(items, cursor)

    async def _read(self, locations: list[tuple[int, int, int]]) -> list[bytes]:
        """The payloads of the records at `locations` (segment, offset, length), read in one worker thread."""
        writer = self._writer
        if writer is not None and not all(
            writer.is_written(segment, offset) for segment, offset, _ in locations
        ):
            await writer.sync().wait()
        segments = [self._segments[segment] for segment, _, _ in locations]
        for segment in segments:
            segment.readers += 1
        try:
            return await trio.to_thread.run_sync(
                _read_payloads,
                [(s, offset, length) for s, (_, offset, length) in zip(segments, locations, strict=True)],
            )
        finally:
            for segment in segments:
                segment.readers -= 1
                segment.close_if_unused()

    def message_ids(self) -> list[str]:
        """Every stored id (live and dead), sorted: for offline tools that walk the whole store."""
        self._readable()
        return sorted(self._index.entries)

    async def get_many(self, message_ids: list[str]) -> list[MessageEntity]:
        """The entities of `message_ids` that still exist, read in one worker thread."""
        self._readable()
        return (await self._page(list(message_ids), max(1, len(message_ids)))).items

    async def stats(self) -> StoreStats:
        self._readable()
        live, uncommitted, dead, dead_by_reason, backlog = self._index.counts()
        await trio.lowlevel.checkpoint()
        return StoreStats(
            kind="file",
            messages=live,
            uncommitted=uncommitted,
            dead=dead,
            dead_by_reason=dead_by_reason,
            backlog_by_topic=backlog,
            waiting=self._index.waiting_by_topic(),
            scheduled_by_topic=self._index.scheduled_by_topic(),
            scheduled_by_hour=dict(self._index.scheduled.by_hour),
            details=self._details(),
        )

    def _details(self) -> dict[str, object]:
        writer, recovered, cache = self._writer, self._recovered, self._cache
        details: dict[str, object] = {
            "directory": str(self.directory),
            "fsync": self.options.fsync.value,
            "read_only": self.options.read_only,
            "segments": len(self._segments),
            "index_entries": len(self._index),
            "cache_entries": len(cache),
            "cache_hit_ratio": round(cache.hits / max(1, cache.hits + cache.misses), 3),
            "segments_reclaimed": self._reclaimed,
            "compactions": self._compactions,
        }
        if recovered is not None:
            details.update(
                recovery_seconds=round(recovered.seconds, 3),
                recovered_records=recovered.records,
                torn_tails_truncated=recovered.truncated,
                damage_skipped=recovered.repaired,
                entries_dropped=recovered.dropped,
            )
        if writer is not None:
            details.update(
                log_generation=writer.log_generation,
                log_bytes=writer.log_size,
                data_end=[writer.segment.number, writer.end],
                fsyncs=writer.fsyncs,
                batches=writer.batches,
                segments_zero_filled=writer.zero_filled_segments,
                next_segment_ready=writer.next_segment_ready,
                records_per_batch=round(writer.batched_records / max(1, writer.batches), 1),
                failed=writer.failure is not None,
            )
        return details

    # -- housekeeping (Trio thread) ----------------------------------------------------------

    def _rotated(self, segment: Segment) -> None:
        """Writes moved on to a new segment; the one they left may already be empty."""
        left = max(self._segments)
        self._segments[segment.number] = segment
        if not self._index.segment_live.get(left):
            self._index.emptied.append(left)
            self._reclaim_emptied(self._writable())

    def _reclaim_emptied(self, writer: Writer) -> None:
        index = self._index
        for number in index.emptied:
            if number == writer.segment.number or index.segment_live.get(number):
                continue
            segment = self._segments.pop(number, None)
            if segment is not None:
                writer.reclaim(segment)
        index.emptied.clear()

    def _batches_done(self, batches: list[Batch]) -> None:
        for batch in batches:
            if batch.snapshot is not None and batch.error is not None:
                self._compacted(batch.snapshot.generation, batch.error, 0.0)  # its compactor never started
            for segment in batch.reclaim:
                segment.retired = True
                segment.close_if_unused()
                self._reclaimed += 1
                self._log.debug("store.segment_reclaimed", segment=segment.number)
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        """Snapshot when the log outgrows the index.

        Not for data: recovery reads a sealed segment's summary, not the segment, so data
        written since the last snapshot costs it about what a snapshot of it would. A
        backlog (saves, nothing finished) then takes no snapshot at all, where one every
        few segments encoded the whole index, a cost that grew with the backlog."""
        writer = self._writer
        if writer is None or writer.failure is not None or self._compaction_pending or self._state != "open":
            return
        index_bytes = len(self._index) * SNAPSHOT_BYTES_PER_ENTRY
        if writer.log_size >= max(self.options.compact_bytes, index_bytes):
            self._snapshot(writer, "log")

    def _data_since_snapshot(self, writer: Writer) -> int:
        """About how many data bytes recovery reads past the last snapshot's mark."""
        segment, offset = self._snapshot_mark
        return (writer.segment.number - segment) * self.options.segment_bytes + writer.end - offset

    def _snapshot(self, writer: Writer, why: str) -> None:
        """Cut the log here and have the writer save the index as it is now."""
        index = self._index
        snapshot = Snapshot(
            generation=writer.log_generation + 1,
            high_water=(writer.segment.number, writer.end),
            entries=index.entries,
            topics=index.topics.values,
            reasons=index.reasons.values,
            groups=index.groups.values,
        )
        # Encoded in a child forked now, from the index as it is (see forked.py); if the
        # system refuses to fork, by the compactor thread from copies, sharing the GIL.
        try:
            snapshot.child = forked.start(functools.partial(write_temporary, self.directory, snapshot))
        except OSError as refused:
            self._log.warning(
                "store.fork_refused",
                error=str(refused),
                detail="the snapshot is written by a thread, which slows the event loop while it runs",
            )
            snapshot = snapshot.copied()
        self._compaction_pending = True
        self._compaction_done = trio.Event()
        self._snapshot_mark = snapshot.high_water
        writer.cut(snapshot)
        self._log.info(
            "store.compaction_started",
            generation=snapshot.generation,
            why=why,
            log_bytes=writer.log_size,
            entries=len(snapshot.entries),
        )

    def _compacted(self, generation: int, result: int | BaseException, seconds: float) -> None:
        self._compaction_pending = False
        self._compaction_done.set()
        if isinstance(result, BaseException):
            self._log.error(
                "store.compaction_failed",
                generation=generation,
                error=str(result),
                detail="the previous log generation is kept; compaction is retried later",
            )
            return
        self._compactions += 1
        self._log.info(
            "store.compacted", generation=generation, snapshot_bytes=result, seconds=round(seconds, 3)
        )

    def _writable(self) -> Writer:
        self._readable()
        if self._writer is None:
            raise StoreError(
                f"the file store {self.directory} is open read-only (offline tools); nothing can change"
            )
        if self._writer.failure is not None:
            raise self._writer.failure
        return self._writer

    def _readable(self) -> None:
        if self._state != "open":
            raise StoreError(f"the file store {self.directory} is not open (state: {self._state})")


def _delivery_op(
    message_id: str,
    succ_groups: Iterable[str],
    fail_groups: Iterable[str],
    deliver_count: int,
    next_deliver_at: float,
) -> Op:
    """The DELIVERY record of a round's outcome (or a transaction check)."""
    groups = (tuple(succ_groups), tuple(fail_groups))
    return Op(RecordType.DELIVERY, message_id, 0, 0, deliver_count, next_deliver_at, groups)


def _distinct(batches: Iterable[Batch | None]) -> list[Batch]:
    """Each batch once (several messages of a save share one), without the Nones."""
    return list({id(batch): batch for batch in batches if batch is not None}.values())


def _limit(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"page limit must be at least 1, not {limit}")
    return limit


def _read_payloads(wanted: list[tuple[Segment, int, int]]) -> list[bytes]:
    """Worker thread: the records' payloads, verified by CRC, read a run at a time in file order."""
    found: list[bytes] = [b""] * len(wanted)
    for run in read_runs(wanted):
        segment = wanted[run[0]][0]
        payloads = segment.read_payloads([(wanted[i][1], wanted[i][2]) for i in run])
        for i, payload in zip(run, payloads, strict=True):
            found[i] = payload
    return found
