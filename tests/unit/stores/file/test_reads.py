"""Reading a page's records: runs of nearby records share one pread."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from stores import MessageEntity
from stores.file import FileStore
from stores.file.segment import READ_GAP, READ_SPAN, Segment, read_runs

FIRST, SECOND = Segment(1, Path("1.seg")), Segment(2, Path("2.seg"))


@pytest.mark.parametrize(
    ("wanted", "runs"),
    [
        pytest.param([(FIRST, 100, 50), (FIRST, 150, 50), (FIRST, 200, 50)], [[0, 1, 2]], id="adjacent"),
        pytest.param([(FIRST, 200, 50), (FIRST, 100, 50), (FIRST, 150, 50)], [[1, 2, 0]], id="file order"),
        pytest.param([(FIRST, 100, 50), (FIRST, 150 + READ_GAP, 50)], [[0, 1]], id="a gap read through"),
        pytest.param([(FIRST, 100, 50), (FIRST, 151 + READ_GAP, 50)], [[0], [1]], id="a gap too wide"),
        pytest.param([(SECOND, 100, 50), (FIRST, 150, 50)], [[1], [0]], id="segments apart"),
        pytest.param(
            [(FIRST, 0, READ_SPAN // 2), (FIRST, READ_SPAN // 2, READ_SPAN // 2)], [[0, 1]], id="span"
        ),
        pytest.param(
            [(FIRST, 0, READ_SPAN // 2), (FIRST, READ_SPAN // 2, READ_SPAN // 2 + 1)],
            [[0], [1]],
            id="past the span",
        ),
        pytest.param([(FIRST, 100, 50), (FIRST, 100, 50)], [[0, 1]], id="the same record twice"),
        pytest.param([], [], id="nothing"),
    ],
)
def test_runs_group_nearby_records_of_one_segment(
    wanted: list[tuple[Segment, int, int]], runs: list[list[int]]
) -> None:
    assert read_runs(wanted) == runs


async def test_a_page_read_from_disk_takes_a_pread_per_run_not_per_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = [
        MessageEntity(uuid.uuid4().hex, "trade", "pay", "order-svc", os.urandom(900), created_at=1.0)
        for _ in range(60)
    ]
    async with FileStore.from_uri(f"file://{tmp_path}?fsync=never") as store:
        for entity in saved:
            await store.save(entity)
    preads = []

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        preads.append(length)
        return real_pread(fd, length, offset)

    real_pread = os.pread
    async with FileStore.from_uri(f"file://{tmp_path}?cache_bytes=0") as store:
        monkeypatch.setattr(os, "pread", counting_pread)
        page = await store.get_many([entity.message_id for entity in saved])
    assert sorted((e.message_id, e.body) for e in page) == sorted((e.message_id, e.body) for e in saved)
    assert len(preads) == 1, f"{len(preads)} preads for 60 records stored one after another"
