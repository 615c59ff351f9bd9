"""Segment summaries: written once a segment is sealed, read by recovery instead of the segment."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from stores import StoreCorrupted
from stores.file import FileStore, layout, summary
from stores.file.records import HEADER_SIZE, RecordType, Scan
from stores.file.recovery import Recovered, recover
from stores.file.verify import verify
from tests.unit.stores.file.test_store import message, names, uri

SEGMENT_BYTES = 8192  # seven 1 KiB messages a segment


async def saved_in_segments(store: FileStore, count: int) -> None:
    """Save `count` messages, then wait until the summaries of the sealed segments are written."""
    for _ in range(count):
        await store.save(message())
    writer = store._writer
    assert writer is not None
    await trio.to_thread.run_sync(lambda: [thread.join() for thread in writer._summarizers])


def recovered(directory: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Recovered, list[str]]:
    """Recover `directory` read-only (beside the open store); and the files it read."""
    read: list[str] = []
    original = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        read.append(path.name)
        return original(path)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "read_bytes", read_bytes)
        result = recover(directory, repair=False, read_only=True)
    for segment in result.segments.values():
        segment.close()
    return result, read


def messages_in(path: Path) -> int:
    data = path.read_bytes()
    return sum(1 for _, rtype, _, _ in Scan(data, layout.HEAD_SIZE) if rtype == RecordType.MESSAGE)


async def test_a_restart_reads_the_summaries_of_sealed_segments_not_the_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=SEGMENT_BYTES)) as store:
        await saved_in_segments(store, 40)
        segments = names(tmp_path, "*.seg")
        assert len(segments) >= 5
        sealed = segments[:-1]
        assert names(tmp_path, "*.sum") == [name.replace(".seg", ".sum") for name in sealed]
        with_summaries, read = recovered(tmp_path, monkeypatch)
        assert sorted(name for name in read if name.endswith(".seg")) == [segments[-1]]
        assert sorted(name for name in read if name.endswith(".sum")) == names(tmp_path, "*.sum")
        for name in names(tmp_path, "*.sum"):
            (tmp_path / name).unlink()
        from_segments, read = recovered(tmp_path, monkeypatch)
        assert sorted(name for name in read if name.endswith(".seg")) == segments
    assert len(with_summaries.index) == 40
    assert with_summaries.index.entries == from_segments.index.entries
    assert with_summaries.records == from_segments.records == 40


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[layout.HEAD_SIZE + HEADER_SIZE + 20] ^= 0xFF
    path.write_bytes(bytes(data))


def without_its_end(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: -(HEADER_SIZE + summary._END.size)])


def another_segments(path: Path) -> None:
    shutil.copyfile(path.with_name(f"{1:010d}.sum"), path)


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (flip_a_byte, "damaged at offset"),
        (without_its_end, "no SUMMARY_END record"),
        (another_segments, "file header says SUM 1, expected sum 2"),
    ],
)
async def test_a_summary_that_cannot_be_used_has_its_segment_read_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: Callable[[Path], None], reason: str
) -> None:
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=SEGMENT_BYTES)) as store:
        await saved_in_segments(store, 30)
        expected, _ = recovered(tmp_path, monkeypatch)
        spoil(tmp_path / f"{2:010d}.sum")
        with capture_logs() as events:
            got, read = recovered(tmp_path, monkeypatch)
    assert [
        (e["segment"], reason in e["reason"]) for e in events if e["event"] == "store.summary_unused"
    ] == [(2, True)]
    assert f"{2:010d}.seg" in read and f"{1:010d}.seg" not in read
    assert got.index.entries == expected.index.entries
    assert got.records == expected.records == 30, "each record counted once"


async def test_a_summary_of_a_segment_that_grew_since_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tmp_path / f"{1:010d}.seg"
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=SEGMENT_BYTES)) as store:
        await saved_in_segments(store, 20)
        size = first.stat().st_size
        with first.open("ab") as f:
            f.write(b"\0" * 10)  # no longer the size its summary vouches for
        with capture_logs() as events, pytest.raises(StoreCorrupted, match="at the end of a sealed file"):
            recovered(tmp_path, monkeypatch)
    assert [e["reason"] for e in events if e["event"] == "store.summary_unused"] == [
        f"it describes {size} bytes of the segment, which has {size + 10}"
    ]


@pytest.mark.parametrize("stop", ["crash", "close"])
async def test_a_segment_continued_after_a_restart_is_summarized_if_recovery_read_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    # Nothing zero-filled ahead, in either run: segment 1 appends until it is full. (With
    # preallocation, the restarted store leaves it as soon as segment 2 is zero-filled, which
    # on a busy machine can come before the second run's first save.)
    store_uri = uri(tmp_path, segment_bytes=SEGMENT_BYTES, preallocate="false")
    async with FileStore.from_uri(store_uri) as store:
        await saved_in_segments(store, 3)
    assert names(tmp_path, "*.seg") == [f"{1:010d}.seg"] and not names(tmp_path, "*.sum")
    if stop == "crash":
        # No snapshot: recovery reads segment 1 from its first record. After a close, the
        # snapshot's mark is inside it, and recovery reads only what follows the mark.
        (tmp_path / "0000000002.snap").unlink()
    async with FileStore.from_uri(store_uri) as store:
        await saved_in_segments(store, 10)
        first = tmp_path / f"{1:010d}.seg"
        entries = summary.read(tmp_path, 1, first.stat().st_size)
        if stop == "crash":
            assert not isinstance(entries, str), entries
            assert len(entries) == messages_in(first) > 3, "the records of both runs"
        else:
            assert entries == "unreadable (No such file or directory)"
            got, read = recovered(tmp_path, monkeypatch)
            assert first.name in read and len(got.index) == 13


async def test_a_backlog_takes_no_snapshot_however_much_data_it_writes(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=SEGMENT_BYTES, fsync="never")) as store:
        await saved_in_segments(store, 300)  # 40 segments: four segments' worth took one before
        assert len(names(tmp_path, "*.seg")) >= 40
        assert (await store.stats()).details["compactions"] == 0
        assert not names(tmp_path, "*.snap")


async def test_reclaimed_segments_leave_no_summary_behind(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=SEGMENT_BYTES, fsync="never")) as store:
        entities = [message() for _ in range(60)]
        for entity in entities:
            await store.save(entity)
        for entity in entities:
            await store.finish(entity.message_id)
        await store.save(message())  # its batch comes after the reclamations the finishes queued
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=SEGMENT_BYTES)) as store:
        assert (await store.stats()).messages == 1
    segments = names(tmp_path, "*.seg")
    assert len(segments) <= 2
    assert set(names(tmp_path, "*.sum")) <= {name.replace(".seg", ".sum") for name in segments[:-1]}


async def test_verify_reports_a_damaged_summary_without_calling_the_store_damaged(tmp_path: Path) -> None:
    async with FileStore.from_uri(uri(tmp_path, segment_bytes=SEGMENT_BYTES)) as store:
        await saved_in_segments(store, 30)
    flip_a_byte(tmp_path / f"{1:010d}.sum")
    report = await trio.to_thread.run_sync(verify, tmp_path)
    assert [(f.name, f.problems[0].split(";")[0]) for f in report.files if f.problems] == [
        (f"{1:010d}.sum", f"offset {layout.HEAD_SIZE}: CRC mismatch")
    ]
    assert not report.damaged and report.messages == 30, "a restart reads segment 1 instead"
