"""What the file store promises beyond the shared contract: locking, group commit, space, snapshots."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from stores import (
    MessageEntity,
    StoreCorrupted,
    StoreError,
    StoreLocked,
    StoreStalled,
    StoreUnavailable,
    idle,
)
from stores.file import FileStore, forked, layout
from stores.file.records import HEADER_SIZE, Scan
from stores.file.slow_writes import SlowWriteBudget
from stores.file.writer import RWF_DSYNC
from tests.helpers import instrumented, yields_in
from tests.unit.stores.file.test_forked import reaped, refuse_to_fork

Seen = TypeVar("Seen")


def message(body: bytes = b"x" * 1000, **fields: object) -> MessageEntity:
    entity = MessageEntity(uuid.uuid4().hex, "trade", "pay", "order-svc", body, created_at=1.0)
    for name, value in fields.items():
        setattr(entity, name, value)
    return entity


# Small synchronous file helpers: the async tests call them on tiny temporary files.


def disk_bytes(directory: Path, pattern: str = "*") -> int:
    return sum(path.stat().st_size for path in directory.glob(pattern))


def names(directory: Path, pattern: str) -> list[str]:
    return sorted(path.name for path in directory.glob(pattern))


def contents(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.iterdir()}


def damage_first_record(directory: Path) -> tuple[Path, int]:
    """Flip a byte in the body of the first record of the first segment; (file, record offset)."""
    segment = sorted(directory.glob("*.seg"))[0]
    data = bytearray(segment.read_bytes())
    first = next(iter(Scan(bytes(data), layout.HEAD_SIZE)))[0]
    data[first + HEADER_SIZE + 300] ^= 0xFF
    segment.write_bytes(bytes(data))
    return segment, first


def append(path: Path, data: bytes) -> int:
    """Append `data`; the size before."""
    size = path.stat().st_size
    with path.open("ab") as f:
        f.write(data)
    return size


def uri(directory: Path, **options: object) -> str:
    query = "&".join(f"{name}={value}" for name, value in options.items())
    return f"file://{directory}" + (f"?{query}" if query else "")


async def test_a_second_opener_is_refused_while_the_first_has_the_store(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path)):
        with pytest.raises(
            StoreLocked, match=rf"{tmp_path} is in use by another process \(pid {os.getpid()}\)"
        ):
            await FileStore.from_uri(uri(tmp_path)).start()
    async with FileStore.from_uri(uri(tmp_path)) as store:
        assert await store.stats()


def test_another_process_holding_the_lock_is_named(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1] + '/LOCK', 'w'); f.write('4242'); f.flush();"
            "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        with pytest.raises(StoreLocked, match="pid 4242"):
            trio.run(FileStore.from_uri(uri(tmp_path)).start)
    finally:
        holder.communicate(b"")


async def test_concurrent_saves_share_fsyncs(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        async with trio.open_nursery() as nursery:
            for _ in range(300):
                nursery.start_soon(store.save, message())
        details = (await store.stats()).details
    assert details["batches"] == details["fsyncs"] < 100
    assert details["records_per_batch"] > 3


class BlockingWaits(trio.abc.Instrument):
    """Counts the times the event loop sleeps waiting for I/O or a wake-up from another thread."""

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        if timeout > 0:
            self.count += 1


async def test_a_lone_save_is_written_in_place_not_handed_to_the_writer_thread(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        await store.save(message())  # the first save also creates the segment
        waited = await lone_saves_waiting_on_the_writer_thread(store, 5)
        details = (await store.stats()).details
    assert waited == 0, "a save waited for the writer thread to wake the event loop"
    assert details["batches"] == details["fsyncs"] == 6, (
        "each save still written and synced before it returns"
    )


async def lone_saves_waiting_on_the_writer_thread(store: FileStore, saves: int) -> int:
    """How many of `saves` lone saves made the event loop sleep until another thread woke it."""

    async def save_them() -> None:
        for _ in range(saves):
            await store.save(message())

    return (await instrumented(BlockingWaits(), save_them)).count


async def test_a_slow_write_in_place_sends_later_saves_to_the_writer_thread(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        await store.save(message())
        writer = store._writer
        assert writer is not None
        # Every write counts as a slow one, and the first spends the whole budget: writes
        # in place then pause for the longest.
        writer.slow_writes = SlowWriteBudget(limit=0.0, share=1e-6, burst=1e-9)
        assert await lone_saves_waiting_on_the_writer_thread(store, 1) == 0, (
            "the first is still written in place"
        )
        assert await lone_saves_waiting_on_the_writer_thread(store, 3) == 3, "then each waits for the thread"
        details = (await store.stats()).details
    assert details["fsyncs"] >= 5, "each save still synced before it returned"


async def test_a_lone_save_is_durable_without_a_turn_of_the_event_loop(tmp_path: Path) -> None:
    # The broker acks a producer once `durable()` returns: on an idle path each turn of the
    # event loop shows in a producer's round trip, so a save written in place costs none.
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        await store.save(message())
        fsyncs = (await store.stats()).details["fsyncs"]
        staged = await store.stage_many([message()])
        assert await yields_in(staged.durable) == 0
        assert (await store.stats()).details["fsyncs"] == fsyncs + 1, "synced before it returned"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)  # another task is ready: it runs first
            staged = await store.stage_many([message()])
            assert await yields_in(staged.durable) == 1, "one yield: to the task ready, then written"


def record_os_calls(
    monkeypatch: pytest.MonkeyPatch, name: str, describe: Callable[..., Seen], into: list[Seen]
) -> list[Seen]:
    """Append `describe(*args)` of every call of `os.<name>` from now on to `into`."""
    real = getattr(os, name)

    def recording(*args: Any) -> Any:
        into.append(describe(*args))
        return real(*args)

    monkeypatch.setattr(os, name, recording)
    return into


def record_writing_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of every pwritev from now on."""
    return record_os_calls(monkeypatch, "pwritev", lambda *args: threading.current_thread().name, [])


async def test_a_change_of_segment_is_written_by_the_writer_thread_never_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sealing a segment and opening the next take the file system's journal (a rename, a
    directory fsync): milliseconds that must not hold up the event loop."""
    writes = record_os_calls(
        monkeypatch,
        "pwritev",
        lambda fd, *args: (Path(os.readlink(f"/proc/self/fd/{fd}")).name, threading.current_thread().name),
        [],
    )
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=16 << 10, preallocate=False)) as store:
        await store.save(message())
        while not layout.path_of(tmp_path, layout.SEGMENT, 3).exists():
            await store.save(message())
    threads = {name: [thread for file, thread in writes if file == name] for name, _ in writes}
    first, *then = threads[layout.path_of(tmp_path, layout.SEGMENT, 2).name]
    assert first.startswith("kiteq-store-writer"), f"segment 2 begun by {first}"
    assert "MainThread" in then, "then saves are written in place again"
    assert threads[layout.path_of(tmp_path, layout.SEGMENT, 3).name][0].startswith("kiteq-store-writer")


async def test_a_save_beside_ready_tasks_is_written_in_place_once_they_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # However busy the machine, the ready task runs well within the grace.
    monkeypatch.setattr(idle, "IDLE_GRACE", 10.0)
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        await store.save(message())
        threads = record_writing_threads(monkeypatch)
        ran: list[str] = []

        async def deliver() -> None:
            ran.append(f"delivered before the write: {not threads}")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deliver)
            waits = await instrumented(BlockingWaits(), functools.partial(store.save, message()))
        assert ran == ["delivered before the write: True"]
        assert threads == [threading.main_thread().name], "written in place, once the loop was idle"
        assert waits.count == 0, "the event loop never slept waiting for the writer thread"
        assert (await store.stats()).details["fsyncs"] == 2


async def test_a_save_whose_sender_has_more_on_its_way_goes_through_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written in place, it would hold the work of the sender's other messages up for a sync.
    monkeypatch.setattr(idle, "IDLE_GRACE", 10.0)
    writer_thread = f"kiteq-store-writer:{tmp_path}"
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        await store.save(message())
        threads = record_writing_threads(monkeypatch)
        staged = await store.stage_many([message()])
        await staged.durable(busy=lambda: True)
        assert threads == [writer_thread]

        # Not busy when it is awaited, busy by the time the ready tasks have run: `busy`
        # is asked at the moment of writing.
        sending = False

        async def next_read() -> None:
            nonlocal sending
            sending = True

        staged = await store.stage_many([message()])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(next_read)
            await staged.durable(busy=lambda: sending)
        assert threads == [writer_thread, writer_thread]

        staged = await store.stage_many([message()])
        await staged.durable()
        assert threads[2:] == [threading.main_thread().name], "a lone save is still written in place"
        assert (await store.stats()).details["fsyncs"] == 4, "each save still synced before it returned"


async def test_a_trickling_senders_saves_share_one_sync_written_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sender with more on its way whose messages come a few to a read (paced) has its
    save held a moment (`gather_delay`) for the next ones: one sync for them all, on the
    event loop's thread, with no hand-off to the writer thread."""
    monkeypatch.setattr(idle, "IDLE_GRACE", 10.0)
    # Not preallocated: a move to the segment zero-filled ahead would take a sync of its own.
    async with FileStore.from_uri(uri(tmp_path, fsync="batch", preallocate=False)) as store:
        await store.save(message())
        assert store._writer is not None
        store._writer.gather_delay = 0.5  # long enough for any machine to stage the others
        fsyncs = (await store.stats()).details["fsyncs"]
        threads = record_writing_threads(monkeypatch)
        durable: list[int] = []

        async def send(index: int) -> None:
            staged = await store.stage_many([message()])
            await staged.durable(busy=lambda: True, trickling=True)
            durable.append(index)

        async with trio.open_nursery() as nursery:
            for index in range(3):
                nursery.start_soon(send, index)
                await trio.testing.wait_all_tasks_blocked()
                assert threads == [] and durable == [], "held for the sender's next saves"
        assert sorted(durable) == [0, 1, 2]
        assert threads == [threading.main_thread().name], "one write, in place"
        assert (await store.stats()).details["fsyncs"] == fsyncs + 1

        # Cancelled while it holds the batch, its first caller still has it written for the others.
        first_waits = trio.CancelScope()

        async def first() -> None:
            with first_waits:
                await send(3)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(send, 4)
            await trio.testing.wait_all_tasks_blocked()
            first_waits.cancel()
        assert durable[3:] == [4]
        assert (await store.stats()).details["fsyncs"] == fsyncs + 2

        # A lone save (nothing more on its way) joining a held batch writes it at once, and
        # its holder returns with it.
        with trio.fail_after(0.4):  # well within the hold of 0.5 s
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, 5)
                await trio.testing.wait_all_tasks_blocked()
                await (await store.stage_many([message()])).durable()
        assert durable[4:] == [5]
        assert (await store.stats()).details["fsyncs"] == fsyncs + 3

        # Not trickling (a read of many), or nothing more on its way: no hold.
        staged = await store.stage_many([message()])
        with trio.fail_after(0.4):
            await staged.durable(busy=lambda: True)
            await (await store.stage_many([message()])).durable(trickling=True)


async def test_without_write_in_place_every_save_goes_through_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # For storage that may stop answering: a write that hangs then holds the writer thread,
    # whose stalls the watchdog reports, never the event loop.
    async with FileStore.from_uri(uri(tmp_path, fsync="batch", write_in_place="false")) as store:
        await store.save(message())
        threads = record_writing_threads(monkeypatch)
        assert await lone_saves_waiting_on_the_writer_thread(store, 2) == 2
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)
            await store.save(message())
        assert set(threads) == {f"kiteq-store-writer:{tmp_path}"}
        assert (await store.stats()).details["fsyncs"] == 4, "each save still synced before it returned"


async def test_a_save_beside_a_loop_that_never_goes_idle_is_written_all_the_same(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        await store.save(message())
        fsyncs = (await store.stats()).details["fsyncs"]
        saved = trio.Event()

        async def busy() -> None:  # always ready to run: the loop never goes idle
            while not saved.is_set():
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(busy)
            with trio.fail_after(5):  # the wait for an idle loop is bounded by IDLE_GRACE
                await store.save(message())
            saved.set()
        assert (await store.stats()).details["fsyncs"] == fsyncs + 1


async def test_a_save_cancelled_while_it_waits_for_the_loop_to_go_idle_is_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the default grace, a slow machine can pass it before the canceller runs: the
    # save then writes in place and returns (Trio counts no task of the batch it is running
    # as ready), and a nursery's exit swallows the Cancelled it meets there.
    monkeypatch.setattr(idle, "IDLE_GRACE", 10.0)
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        await store.save(message())
        data = disk_bytes(tmp_path, "*.seg")
        with trio.CancelScope() as scope:

            async def cancel() -> None:
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel)  # ready to run: the save waits for it, and is cancelled
                await store.save(message())
        assert scope.cancelled_caught
        with trio.fail_after(5):  # handed over as it was cancelled, not left for the close
            while disk_bytes(tmp_path, "*.seg") == data:
                await trio.sleep(0.001)


async def test_finishing_in_batch_mode_costs_no_turn_of_the_event_loop(tmp_path: Path) -> None:
    # The outcome recorder yields just before it finishes the rounds that completed; the
    # finishes are logged lazily in batch mode, so a second yield would only cost a turn.
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        entity = message()
        await store.save(entity)
        answers: list[list[bool]] = []

        async def finish() -> None:
            answers.append(await store.finish_many([entity.message_id]))

        assert await yields_in(finish) == 0
        assert answers == [[True]] and await store.get(entity.message_id) is None


async def test_a_save_nobody_waits_for_is_still_written_by_the_close(tmp_path: Path) -> None:
    kept = message()
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        staged = await store.stage_many([kept])  # its caller never awaits staged.durable()
        assert staged.saved == [True]
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        found = await store.get(kept.message_id)
    assert found is not None and found.body == kept.body


@pytest.mark.parametrize(("mode", "lazy_fsyncs"), [("batch", False), ("always", True)])
async def test_only_decisions_wait_for_an_fsync_in_batch_mode(
    tmp_path: Path, mode: str, lazy_fsyncs: bool
) -> None:
    async with FileStore.from_uri(uri(tmp_path, fsync=mode)) as store:
        entities = [message(commit=False) for _ in range(20)]
        for entity in entities:
            await store.save(entity)
        before = (await store.stats()).details["fsyncs"]
        for entity in entities:
            await store.update_delivery(entity.message_id, [], ["sms"], 1, 5.0)
        await trio.sleep(0.2)  # the writer drains what was logged lazily
        after_lazy = (await store.stats()).details["fsyncs"]
        for entity in entities:
            await store.commit(entity.message_id)
        after_commits = (await store.stats()).details["fsyncs"]
    assert (after_lazy - before >= 20) is lazy_fsyncs
    assert after_commits - after_lazy >= 20, "each sequential commit waits for its own fsync"


async def test_the_next_segment_is_zero_filled_ahead_written_in_place_and_cut_to_its_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    segment_bytes = 16 << 10
    writes = record_os_calls(
        monkeypatch,
        "pwritev",
        lambda fd, buffers, offset, flags=0: (os.readlink(f"/proc/self/fd/{fd}"), flags),
        [],
    )

    def segment(number: int) -> Path:
        return layout.path_of(tmp_path, layout.SEGMENT, number)

    def records_end(path: Path) -> int:
        scan = Scan(path.read_bytes(), layout.HEAD_SIZE)
        for _ in scan:
            pass
        return scan.end

    saved: list[str] = []
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=segment_bytes)) as store:

        async def fill_into(number: int) -> None:
            with trio.fail_after(10):
                while not (await store.stats()).details["next_segment_ready"]:
                    await trio.sleep(0.001)
            while not segment(number).exists():
                entity = message()
                await store.save(entity)
                saved.append(entity.message_id)

        await fill_into(2)
        assert not layout.zero_filled(segment(1).read_bytes()), "a new store's first is created when needed"
        assert layout.zero_filled(segment(2).read_bytes())
        assert segment(2).stat().st_size == segment_bytes, "zero-filled whole"
        writes.clear()
        entity = message()
        await store.save(entity)
        saved.append(entity.message_id)
        assert [flags for path, flags in writes if path == str(segment(2))] == [RWF_DSYNC]
        assert segment(2).stat().st_size == segment_bytes, "written in place: its size is unchanged"
        await fill_into(3)
        assert segment(2).stat().st_size == records_end(segment(2)), "sealed: it ends with its records"
        assert (await store.stats()).details["segments_zero_filled"] == 2
    assert segment(3).stat().st_size == records_end(segment(3)), "closed: the unused zeros are cut off"
    assert not layout.list_files(tmp_path).temporary, "the segment prepared after it is deleted"
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=segment_bytes)) as store:
        assert all([await store.get(message_id) for message_id in saved])
        assert (await store.stats()).details["torn_tails_truncated"] == []


async def test_a_segment_that_appends_is_left_once_the_next_is_ready(tmp_path: Path) -> None:
    """A new store's first segment, and the one a restart continues, append: each of their
    synced writes changes the file's size. Once the next segment is zero-filled, saves
    move on to it, however much room the appending one has left."""
    segment_bytes = 4 << 20

    def segment(number: int) -> Path:
        return layout.path_of(tmp_path, layout.SEGMENT, number)

    async def ready(store: FileStore) -> None:
        with trio.fail_after(10):
            while not (await store.stats()).details["next_segment_ready"]:
                await trio.sleep(0.001)

    saved: list[str] = []

    async def save(store: FileStore) -> None:
        entity = message()
        await store.save(entity)
        saved.append(entity.message_id)

    async with FileStore.from_uri(uri(tmp_path, segment_bytes=segment_bytes)) as store:
        await save(store)
        await ready(store)
        await save(store)
        assert not layout.zero_filled(segment(1).read_bytes())
        assert segment(1).stat().st_size < segment_bytes // 100, "left with nearly all its room"
        assert layout.zero_filled(segment(2).read_bytes()), "the second save went to the zero-filled one"
        await ready(store)
        await save(store)
        assert not segment(3).exists(), "a zero-filled segment is kept until it is full"
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=segment_bytes)) as store:
        await save(store)
        assert not segment(3).exists(), "a restart continues the last segment, appending"
        await ready(store)
        await save(store)
        assert layout.zero_filled(segment(3).read_bytes()), "and leaves it once the next is ready"
        assert all([await store.get(message_id) for message_id in saved])
        assert (await store.stats()).details["segments_zero_filled"] == 1


async def test_lazy_changes_share_the_next_saves_write_or_are_written_soon_after(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        first, second = message(), message()
        await store.save(first)
        batches = (await store.stats()).details["batches"]
        log_bytes = disk_bytes(tmp_path, "*.log")
        await store.finish(first.message_id)
        await store.save(second)  # within LAZY_WRITE_DELAY of the finish: one write for both
        assert (await store.stats()).details["batches"] == batches + 1
        assert disk_bytes(tmp_path, "*.log") > log_bytes, "the finish was written with the save"
        log_bytes = disk_bytes(tmp_path, "*.log")
        await store.finish(second.message_id)  # no save follows: written on its own
        # The writer thread counts a batch after its pwritev: wait for the count, not the bytes.
        with trio.fail_after(5):
            while (await store.stats()).details["batches"] == batches + 1:
                await trio.sleep(0.001)
        assert (await store.stats()).details["batches"] == batches + 2
        assert disk_bytes(tmp_path, "*.log") > log_bytes, "the finish was written in its own batch"


async def test_a_durable_write_to_a_synced_file_syncs_itself_else_the_file_is_fdatasynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pwritev with RWF_DSYNC instead of a write and an fdatasync, but only where no
    earlier unsynced write would be left behind (RWF_DSYNC syncs just its own range)."""
    calls: list[tuple[str, str, int]] = []

    def suffix(fd: int) -> str:
        return Path(os.readlink(f"/proc/self/fd/{fd}")).suffix

    def write(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> tuple[str, str, int]:
        return ("write", suffix(fd), flags)

    record_os_calls(monkeypatch, "pwritev", write, calls)
    record_os_calls(monkeypatch, "fdatasync", lambda fd: ("fdatasync", suffix(fd), 0), calls)
    # Segments appended, not zero-filled ahead: the preparer's own writes stay out of `calls`.
    async with FileStore.from_uri(uri(tmp_path, fsync="batch", preallocate="false")) as store:
        first, second, third, fourth = message(), message(), message(), message()
        pending = message(commit=False)
        await store.save(first)  # a new segment: its header was written unsynced
        await store.save(pending)
        assert ("fdatasync", ".seg", 0) in calls
        calls.clear()
        await store.save(second)
        assert calls == [("write", ".seg", RWF_DSYNC)], "the synced segment: one synced write"
        calls.clear()
        batches = (await store.stats()).details["batches"]
        await store.finish(second.message_id)  # lazily logged: written later, not synced
        with trio.fail_after(5):
            while (await store.stats()).details["batches"] == batches:
                await trio.sleep(0.001)
        assert calls and set(calls) == {("write", ".log", 0)}, "the log's header and the finish"
        calls.clear()
        await store.save(third)
        assert calls == [("write", ".seg", RWF_DSYNC)], "a save syncs its data, not the lazy finish before"
        calls.clear()
        await store.finish(third.message_id)
        await store.save(fourth)  # within LAZY_WRITE_DELAY of the finish: one batch for both
        assert calls == [("write", ".seg", RWF_DSYNC), ("write", ".log", 0)], (
            "a finish riding along with a save is written, not synced: the save costs one fsync, not two"
        )
        calls.clear()
        await store.commit(pending.message_id)
        assert calls == [("write", ".log", 0), ("fdatasync", ".log", 0)], (
            "a decision is synced, with the unsynced finishes before it: by an fdatasync of the whole log"
        )


async def test_fsync_never_still_hands_every_save_to_the_os(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, fsync="never")) as store:
        entity = message()
        await store.save(entity)
        details = (await store.stats()).details
        assert details["fsyncs"] == 0
        assert entity.body in b"".join(contents(tmp_path).values())


async def test_finished_segments_are_deleted_until_about_one_is_left(tmp_path: Path) -> None:
    segment = 16 << 10
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=segment, fsync="never")) as store:
        entities = [message() for _ in range(300)]
        for entity in entities:
            await store.save(entity)
        assert disk_bytes(tmp_path, "*.seg") > 15 * segment
        kept_dead = entities[150]
        await store.dead_letter(kept_dead.message_id, "expired")
        for entity in entities:
            if entity is not kept_dead:
                await store.finish(entity.message_id)
        await store.save(message())  # its batch comes after the reclamations queued by the finishes
        assert disk_bytes(tmp_path, "*.seg") <= 2 * segment + segment, "the current one and the dead letter's"
        await store.purge(kept_dead.message_id)
        await store.save(message())
        assert disk_bytes(tmp_path, "*.seg") <= segment + 2048
        assert (await store.stats()).details["segments_reclaimed"] >= 17
    async with FileStore.from_uri(uri(tmp_path)) as store:
        assert (await store.stats()).messages == 2


async def test_rolled_back_messages_free_their_segments_too(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=8192, fsync="never")) as store:
        entities = [message(commit=False) for _ in range(40)]
        for entity in entities:
            await store.save(entity)
        for entity in entities:
            await store.rollback(entity.message_id)
        await store.save(message())
        assert len(names(tmp_path, "*.seg")) == 1


@pytest.mark.parametrize("fork", ["allowed", "refused"])
async def test_the_log_is_compacted_into_snapshots(
    tmp_path: Path, fork: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Snapshots are written by a forked child; where the system refuses to fork, by a thread.
    if fork == "refused":
        monkeypatch.setattr(os, "fork", refuse_to_fork)
    options = {"fsync": "never", "compact_bytes": 8192}
    with capture_logs() as events:
        async with FileStore.from_uri(uri(tmp_path, **options)) as store:
            entities = [message() for _ in range(50)]
            for entity in entities:
                await store.save(entity)
            rounds = 0
            with trio.fail_after(60):  # a snapshot waits for fsyncs, slow on a busy disk
                while (await store.stats()).details["compactions"] < 3:
                    for entity in entities:
                        await store.update_delivery(
                            entity.message_id, ["a"], ["b", "c"], rounds, 1000.0 + rounds
                        )
                    await store.save(message())
                    rounds += 1
            logs = names(tmp_path, "*.log")
    assert logs[0] != "0000000001.log", "old generations are deleted while the store runs"
    refusals = [event for event in events if event["event"] == "store.fork_refused"]
    started = [event for event in events if event["event"] == "store.compaction_started"]
    # Three finished while open; how many more started (in the last round, at close) is timing.
    assert len(started) >= 4
    assert len(refusals) == (len(started) if fork == "refused" else 0)
    assert all("Resource temporarily unavailable" in event["error"] for event in refusals)
    async with FileStore.from_uri(uri(tmp_path)) as store:
        got = await store.get(entities[7].message_id)
        assert got is not None and (got.deliver_count, got.next_deliver_at) == (rounds - 1, 999.0 + rounds)
        assert got.succ_groups == ("a",) and got.fail_groups == ("b", "c")
        assert (await store.stats()).details["recovered_records"] == 50 + rounds
    assert disk_bytes(tmp_path, "*.log") < 100, "the close left a snapshot"


async def test_a_snapshot_that_fails_to_be_written_is_retried_at_the_next_cut(tmp_path: Path) -> None:
    # The child writing generation 2's snapshot cannot create its file; the log is kept
    # and the next snapshot (generation 3) replaces it.
    options = {"fsync": "never", "compact_bytes": 8192}
    with capture_logs() as logs:
        async with FileStore.from_uri(uri(tmp_path, **options)) as store:
            (tmp_path / "0000000002.snap.tmp").mkdir()
            entities = [message() for _ in range(50)]
            for entity in entities:
                await store.save(entity)
            rounds = 0
            with trio.fail_after(60):
                while (await store.stats()).details["compactions"] < 1:
                    for entity in entities:
                        await store.update_delivery(entity.message_id, ["a"], [], rounds, 1000.0 + rounds)
                    await store.save(message())  # yields to the loop, which takes in the compactor's report
                    rounds += 1
            # Generation 3 replaced the failed 2; a 4th, cut as 3 was taken in, may be installed too.
            snapshots = names(tmp_path, "*.snap")
            assert snapshots and min(snapshots) >= "0000000003.snap", snapshots
    [failed] = [entry for entry in logs if entry["event"] == "store.compaction_failed"]
    assert failed["generation"] == 2
    assert "exited with status 1: IsADirectoryError" in failed["error"]
    (tmp_path / "0000000002.snap.tmp").rmdir()
    async with FileStore.from_uri(uri(tmp_path)) as store:
        got = await store.get(entities[7].message_id)
        assert got is not None and got.deliver_count == rounds - 1


async def test_a_failed_write_fails_the_store_and_abandons_the_snapshot_it_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    children: list[forked.Forked] = []
    fork = forked.start

    def start(work: Callable[[], int]) -> forked.Forked:
        children.append(fork(work))  # the real child, only recorded
        return children[-1]

    monkeypatch.setattr(forked, "start", start)
    entity = message()
    with capture_logs() as logs:
        async with FileStore.from_uri(uri(tmp_path)) as store:
            await store.save(entity)
            await store.update_delivery(entity.message_id, ["a"], [], 0, 4.0)
            await store.save(message())  # writes the log record above with it: the log is open
            writer = store._writer
            assert writer is not None and writer._log_fd is not None
            # The operation log now refuses writes (EBADF), as a failed device would.
            read_only = os.open(os.devnull, os.O_RDONLY)
            os.dup2(read_only, writer._log_fd)
            os.close(read_only)
            await store.update_delivery(entity.message_id, ["a"], [], 1, 5.0)  # lazily logged
            store._snapshot(writer, "test")  # its batch writes that record, and fails
            await store._compaction_done.wait()
            with pytest.raises(StoreUnavailable, match="accepts no more writes"):
                await store.save(message())
    [child] = children
    assert reaped(child.pid)
    assert names(tmp_path, "*.snap") == []  # what it wrote was never installed
    [failed] = [entry for entry in logs if entry["event"] == "store.compaction_failed"]
    assert "accepts no more writes" in failed["error"]
    async with FileStore.from_uri(uri(tmp_path)) as store:  # the change before the failure is kept
        got = await store.get(entity.message_id)
        assert got is not None and (got.succ_groups, got.next_deliver_at) == (("a",), 4.0)


async def test_a_clean_close_leaves_a_snapshot_so_restarts_skip_the_data(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path)) as store:
        for _ in range(30):
            await store.save(message())
    assert names(tmp_path, "*.snap") == ["0000000002.snap"]
    # A damaged body is not noticed at start (the data is not read), only when read back.
    segment, first = damage_first_record(tmp_path)
    async with FileStore.from_uri(uri(tmp_path, cache_bytes=0)) as store:
        assert (await store.stats()).messages == 30
        with pytest.raises(StoreCorrupted, match=f"{segment} offset {first}: CRC mismatch"):
            await store.page_due(10.0, None, 100)


async def test_read_only_changes_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="there is no store at"):
        await FileStore.from_uri(uri(tmp_path / "missing"), read_only=True).start()
    async with FileStore.from_uri(uri(tmp_path)) as store:
        entity = message()
        await store.save(entity)
    [segment] = names(tmp_path, "*.seg")
    torn_at = append(tmp_path / segment, b"torn")
    before = contents(tmp_path)
    async with FileStore.from_uri(uri(tmp_path), read_only=True) as store:
        assert await store.get(entity.message_id) == entity
        with pytest.raises(StoreError, match="read-only"):
            await store.save(message())
        with pytest.raises(StoreError, match="read-only"):
            await store.finish(entity.message_id)
        assert (await store.stats()).details["torn_tails_truncated"] == [f"{segment}@{torn_at}"]
    assert contents(tmp_path) == before


async def test_misuse_is_a_clear_error(tmp_path: Path) -> None:
    store = FileStore.from_uri(uri(tmp_path))
    with pytest.raises(StoreError, match="not open"):
        await store.get("x")
    async with store:
        with pytest.raises(StoreError, match="already started"):
            await store.start()
        with pytest.raises(StoreError, match="topic 70000 bytes"):
            await store.save(message(topic="t" * 70_000))
        with pytest.raises(ValueError, match="at least 1"):
            await store.page_dead(None, 0)
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        await store.save(message())


async def test_ids_may_come_back_after_they_are_finished(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=4096)) as store:
        first = message(body=b"first")
        await store.save(first)
        await store.update_delivery(first.message_id, ["a"], [], 3, 7.0)
        await store.finish(first.message_id)
        again = message(body=b"again")
        again.message_id = first.message_id
        assert await store.save(again) is True
    async with FileStore.from_uri(uri(tmp_path)) as store:
        assert await store.get(first.message_id) == again, "ops of the first never touch the second"


def damage_snapshot_entries(directory: Path) -> Path:
    """Flip a byte inside the first SNAPSHOT_ENTRIES record of the snapshot."""
    [snapshot] = sorted(directory.glob("*.snap"))
    data = bytearray(snapshot.read_bytes())
    entries = next(start for _, rtype, start, _ in Scan(bytes(data), layout.HEAD_SIZE) if rtype == 12)
    data[entries + 40] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    return snapshot


async def test_a_damaged_snapshot_refuses_to_start_and_repair_finds_its_messages_in_the_data(
    tmp_path: Path,
) -> None:
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=8192)) as store:
        kept = [message() for _ in range(20)]
        for entity in kept:
            await store.save(entity)
        await store.dead_letter(kept[0].message_id, "expired")
        await store.commit(kept[1].message_id)
    snapshot = damage_snapshot_entries(tmp_path)
    with pytest.raises(StoreCorrupted, match=f"{snapshot}: snapshot damaged at offset"):
        await FileStore.from_uri(uri(tmp_path)).start()
    async with FileStore.from_uri(uri(tmp_path), repair=True) as store:
        assert [await store.get(entity.message_id) for entity in kept[1:]] == kept[1:]
        details = (await store.stats()).details
        assert details["damage_skipped"] and details["damage_skipped"][0].startswith(snapshot.name)
    async with FileStore.from_uri(uri(tmp_path)) as store:
        assert (await store.stats()).messages >= 19, "the repaired store starts on its own"


class CountingSkip(set[str]):
    """A skip set that counts the ids it is asked about."""

    asked = 0

    def __contains__(self, message_id: object) -> bool:
        self.asked += 1
        return super().__contains__(message_id)


async def test_a_page_walks_only_as_far_as_it_needs(tmp_path: Path) -> None:
    """page_due stops walking once the page is full: a backlog behind it costs nothing (also
    compiled, where a generator expression would be built into a whole list first)."""
    async with FileStore.from_uri(uri(tmp_path, fsync="never")) as store:
        for _ in range(200):
            await store.save(message(body=b"x", next_deliver_at=1.0))
        skip = CountingSkip()
        page = await store.page_due(10.0, None, 3, skip)
    assert len(page.items) == 3 and page.cursor is not None
    assert skip.asked == 4, (
        f"the walk asked about {skip.asked} ids for a page of 3 and one to tell there is more"
    )


async def test_a_stalled_disk_fails_waiting_saves_in_time_and_writes_them_once_it_is_back(
    tmp_path: Path,
) -> None:
    first, second = message(), message()
    async with FileStore.from_uri(uri(tmp_path, fsync="batch")) as store:
        writer = store._writer
        assert writer is not None
        writer.stall_timeout = 0.2
        writer._io.acquire()  # the disk stalls: no batch can be written, in place or by the thread
        try:
            with trio.fail_after(5):
                with pytest.raises(StoreStalled, match="has finished no write for"):
                    await store.save(first)
                # One that waits after the stall was reported gets a timeout of its own.
                with pytest.raises(StoreStalled):
                    await store.save(second)
        finally:
            writer._io.release()
        assert await store.save_many([first, second]) == [False, False], "both were written meanwhile"
    async with FileStore.from_uri(uri(tmp_path)) as store:
        assert await store.get(first.message_id) == first
        assert await store.get(second.message_id) == second
