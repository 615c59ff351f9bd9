"""One data segment file: created by the writer, read by worker threads, retired when empty.

A segment's descriptor is shared by the writer (pwritev at reserved offsets) and
readers (pread), so neither moves a file position. Reclamation unlinks the file
while readers may still hold the descriptor; it is closed once the last reader is
done (`readers` is counted on the Trio thread).
"""

from __future__ import annotations

import os
from pathlib import Path

from stores.errors import StoreCorrupted
from stores.file import layout, records


class Segment:
    __slots__ = ("fd", "number", "path", "readers", "retired")

    def __init__(self, number: int, path: Path, fd: int | None = None) -> None:
        self.number = number
        self.path = path
        self.fd = fd
        self.readers = 0
        self.retired = False

    def create(self) -> None:
        """Create the file with its header (writer thread)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        layout.write_all(fd, [layout.file_head(layout.SEGMENT, self.number)], 0)
        self.fd = fd

    def open(self, *, writable: bool) -> None:
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        self.fd = os.open(self.path, flags)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close_if_unused(self) -> None:
        """Close a retired segment's descriptor once no reader holds it."""
        if self.retired and self.readers == 0:
            self.close()

    def read_payload(self, offset: int, length: int) -> bytes:
        """The verified payload of the record at `offset` (worker thread)."""
        assert self.fd is not None, f"segment {self.number} is not open"
        data = os.pread(self.fd, length, offset)
        found = records.check(data, 0, len(data))
        if isinstance(found, str) or found[1] != length - records.HEADER_SIZE:
            reason = found if isinstance(found, str) else "length differs from the index"
            raise StoreCorrupted(
                f"{self.path} offset {offset}: {reason}; run `kiteq-admin store verify` and restore "
                "the store or restart with ?repair=true"
            )
        return data[records.HEADER_SIZE :]
