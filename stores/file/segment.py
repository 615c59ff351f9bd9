"""One data segment file: created by the writer, read by worker threads, retired when empty.

A segment's descriptor is shared by the writer (pwritev at reserved offsets) and
readers (pread), so neither moves a file position. Reclamation unlinks the file
while readers may still hold the descriptor; it is closed once the last reader is
done (`readers` is counted on the Trio thread), on a thread of its own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from stores.errors import StoreCorrupted
from stores.file import layout, records
from stores.file.summary import Summary


class Segment:
    __slots__ = ("fd", "number", "path", "readers", "retired", "summary")

    def __init__(self, number: int, path: Path, fd: int | None = None) -> None:
        self.number = number
        self.path = path
        self.fd = fd
        self.readers = 0
        self.retired = False
        # Its records so far, for the summary written once it is sealed; None when not all
        # of them are known (a segment recovery did not read whole), so none is written.
        self.summary: Summary | None = Summary()

    def create(self) -> None:
        """Create the file with its header (writer thread)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        layout.write_all(fd, [layout.file_head(layout.SEGMENT, self.number)], 0)
        self.fd = fd

    def open(self, *, writable: bool) -> None:
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        self.fd = os.open(self.path, flags)

    def unlink(self, *, missing_ok: bool = False) -> None:
        """Delete the file, and its summary first: a summary never outlives its segment."""
        layout.path_of(self.path.parent, layout.SUMMARY, self.number).unlink(missing_ok=True)
        self.path.unlink(missing_ok=missing_ok)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close_if_unused(self) -> None:
        """Close a retired segment's descriptor once no reader holds it. The file is unlinked
        already, so this last close frees its blocks: `layout.release` does it on a thread
        of its own, never on the caller's (the event loop's)."""
        if self.retired and self.readers == 0 and self.fd is not None:
            fd, self.fd = self.fd, None
            layout.release(fd)

    def read_payload(self, offset: int, length: int) -> bytes:
        """The verified payload of the record at `offset` (worker thread)."""
        return self.read_payloads([(offset, length)])[0]

    def read_payloads(self, run: Sequence[tuple[int, int]]) -> list[bytes]:
        """The verified payloads of the records at (offset, length), in file order and close
        together (`read_runs`), read with one pread (worker thread)."""
        assert self.fd is not None, f"segment {self.number} is not open"
        start = run[0][0]
        end = max(offset + length for offset, length in run)
        data = os.pread(self.fd, end - start, start)
        view = memoryview(data)
        payloads = []
        for offset, length in run:
            at = offset - start
            found = records.check(view, at, min(at + length, len(data)))
            if isinstance(found, str) or found[1] != length - records.HEADER_SIZE:
                reason = found if isinstance(found, str) else "length differs from the index"
                raise StoreCorrupted(
                    f"{self.path} offset {offset}: {reason}; run `kiteq-admin store verify` and restore "
                    "the store or restart with ?repair=true"
                )
            payloads.append(data[at + records.HEADER_SIZE : at + length])
        return payloads


# A page's records mostly lie one after another in a segment (stored in the order they
# arrived): one pread per run of them instead of one per record, and each pread in the
# worker thread is also a hand-over of the GIL with the event loop. A run ends at a gap of
# more than READ_GAP bytes (what lies between is read and dropped) or at READ_SPAN bytes.
READ_GAP = 16 * 1024
READ_SPAN = 1024 * 1024


def read_runs(wanted: Sequence[tuple[Segment, int, int]]) -> list[list[int]]:
    """The indexes of `wanted` (segment, offset, length), in file order, grouped into runs
    that `Segment.read_payloads` reads with one pread each."""
    order = sorted(range(len(wanted)), key=lambda i: (wanted[i][0].number, wanted[i][1]))
    runs: list[list[int]] = []
    run_segment: Segment | None = None
    run_start = run_end = 0
    for i in order:
        segment, offset, length = wanted[i]
        end = offset + length
        if (
            segment is not run_segment
            or offset - run_end > READ_GAP
            or max(end, run_end) - run_start > READ_SPAN
        ):
            runs.append([])
            run_segment, run_start, run_end = segment, offset, end
        runs[-1].append(i)
        run_end = max(run_end, end)
    return runs
