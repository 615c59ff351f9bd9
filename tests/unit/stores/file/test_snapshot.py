"""Writing a snapshot file: streamed and synced in parts as it is written, and read back whole."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from stores.file import layout, snapshot
from stores.file.index import ENTRY
from stores.file.layout import SYNC_EVERY_BYTES
from stores.file.snapshot import Snapshot
from tests.unit.stores.file.test_store import record_os_calls


def test_a_large_snapshot_is_streamed_and_synced_in_parts_as_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 200,000 entries fill 15 chunks of a MiB.
    entries = {f"{i:032x}": i.to_bytes(ENTRY.size, "little") for i in range(200_000)}
    taken = Snapshot(3, (1, layout.HEAD_SIZE), entries, [""], [""], [((), ())])
    synced_at = record_os_calls(monkeypatch, "fdatasync", lambda fd: os.fstat(fd).st_size, [])
    tracemalloc.start()
    try:
        size = snapshot.write_temporary(tmp_path, taken)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < size // 3, f"held {peak} bytes at once for a {size}-byte file: streamed, not built whole"
    parts = [end - start for start, end in zip([0, *synced_at], synced_at, strict=False)]
    assert len(parts) >= size // SYNC_EVERY_BYTES - 1 > 2, "synced in parts, not once at the end"
    assert all(part >= SYNC_EVERY_BYTES for part in parts), f"no part smaller than a sync's worth: {parts}"
    assert all(part < 2 * SYNC_EVERY_BYTES for part in parts), f"nor larger than two: {parts}"
    assert synced_at[-1] <= size
    assert synced_at[0] < size // 2, "the first part is synced long before the end"
    snapshot.install(tmp_path, 3)
    loaded = snapshot.load(layout.path_of(tmp_path, layout.SNAPSHOT, 3), 3, repair=False)
    assert loaded.entries == entries
