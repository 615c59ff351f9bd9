"""A sealed segment's pages leave the page cache (unless `cache_sealed=true`): a store that
keeps all it writes cached grows the page cache by all it stores."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from stores.file import FileStore, layout
from tests.unit.stores.file.test_store import uri
from tests.unit.stores.file.test_summary import SEGMENT_BYTES, saved_in_segments

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def resident_pages(path: Path) -> int:
    """How many of `path`'s pages the page cache holds (mincore(2) over a mapping of it;
    mapping a file reads none of it)."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address != ctypes.c_void_p(-1).value, os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    try:
        assert _libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
    finally:
        _libc.munmap(address, size)
    return sum(byte & 1 for byte in vector)


def _filesystem_of(path: Path) -> str:
    """The type of the file system `path` is on, from /proc/mounts (the longest mount point)."""
    best, kind = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        if str(path).startswith(point) and len(point) > len(best):
            best, kind = point, fstype
    return kind


@pytest.mark.parametrize("cache_sealed", [False, True], ids=["dropped", "cache_sealed"])
async def test_sealed_segments_leave_the_page_cache_unless_kept(tmp_path: Path, cache_sealed: bool) -> None:
    if _filesystem_of(tmp_path) == "tmpfs":
        pytest.skip("tmpfs keeps its files in the page cache: nothing to drop")
    async with FileStore.from_uri(
        uri(tmp_path, segment_bytes=SEGMENT_BYTES, cache_sealed=cache_sealed)
    ) as store:
        await saved_in_segments(store, 40)  # the summary threads drop the pages, then end
        numbers = sorted(store._segments)
        sealed = [layout.path_of(tmp_path, layout.SEGMENT, number) for number in numbers[:-1]]
        active = layout.path_of(tmp_path, layout.SEGMENT, numbers[-1])
        assert len(sealed) >= 4
        resident = [resident_pages(path) for path in sealed]
        if cache_sealed:
            assert all(resident), f"pages per sealed segment: {resident}"
        else:
            assert not any(resident), f"pages per sealed segment: {resident}"
        assert resident_pages(active), "the segment being written stays cached"
