"""Offline verification of a store directory: every record of every file, then the index.

Unlike start(), which stops at the first damage, `verify` reads everything and
reports every damaged stretch with its file and offset, then rebuilds the index
read-only (with repair, so damage does not stop it) and reads back each indexed
message to check that it decodes. It takes the directory's lock like a broker
would, so it refuses to run beside one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from stores.errors import StoreError
from stores.file import layout, records
from stores.file.index import unpack
from stores.file.lock import DirectoryLock
from stores.file.messages import decode_message
from stores.file.preallocation import split_damage, until_torn_write, zeros_start
from stores.file.recovery import recover


@dataclass
class FileReport:
    name: str
    bytes: int
    records: int
    problems: list[str] = field(default_factory=list)
    torn_tail: str = ""
    # A summary: damage to it costs a restart time (the segment is read instead), not data.
    redundant: bool = False


@dataclass
class Report:
    directory: str
    files: list[FileReport] = field(default_factory=list)
    messages: int = 0
    unreadable: list[str] = field(default_factory=list)

    @property
    def damaged(self) -> bool:
        """Damage a plain restart would refuse (a torn tail is repaired at start, so it is not)."""
        return bool(self.unreadable) or any(f.problems for f in self.files if not f.redundant)


def verify(directory: Path) -> Report:
    """Check every file and every indexed message of the store in `directory` (blocking)."""
    if not directory.is_dir():
        raise StoreError(f"there is no store at {directory}")
    lock = DirectoryLock(directory)
    lock.acquire()
    try:
        report = Report(str(directory))
        listing = layout.list_files(directory)
        kinds = (
            (layout.SEGMENT, listing.segments),
            (layout.LOG, listing.logs),
            (layout.SNAPSHOT, listing.snapshots),
            (layout.SUMMARY, listing.summaries),
        )
        for kind, numbers in kinds:
            for number in numbers:
                last = number == numbers[-1] and kind in (layout.SEGMENT, layout.LOG)
                report.files.append(_check_file(directory, kind, number, last))
        report.files += [_check_temporary(p) for p in listing.temporary]
        _check_messages(directory, report)
    finally:
        lock.release()
    return report


def _check_file(directory: Path, kind: str, number: int, last: bool) -> FileReport:
    path = layout.path_of(directory, kind, number)
    data = path.read_bytes()
    report = FileReport(path.name, len(data), 0, redundant=kind == layout.SUMMARY)
    problem = layout.head_problem(data, kind, number)
    if problem:
        report.problems.append(f"offset 0: {problem}")
    # A zero-filled last segment (preallocation.py) ends where its zeros begin.
    zeros = zeros_start(data, kind) if last and not problem else None
    scan = records.Scan(data, layout.HEAD_SIZE, skip_damage=True, stop=zeros)
    for _ in until_torn_write(scan, zeros):
        report.records += 1
    damages, torn = split_damage(scan.damages, zeros, last)
    for damage in damages:
        where = f"offset {damage.offset}: {damage.reason}"
        if damage.torn_tail:
            report.problems.append(f"{where} up to the end of a sealed file")
        else:
            report.problems.append(f"{where}; good records resume at {damage.resume}")
    if torn is not None:
        end = len(data) if zeros is None else zeros
        report.torn_tail = (
            f"offset {torn.offset}: {torn.reason} ({end - torn.offset} bytes, truncated at the next start)"
        )
    return report


def _check_temporary(path: Path) -> FileReport:
    if path.name.endswith(f".{layout.SEGMENT}.tmp"):
        # Zero-filled ahead and never used (preallocation.py): nothing in it to lose.
        return FileReport(
            path.name, path.stat().st_size, 0, ["a segment zero-filled ahead, unused"], redundant=True
        )
    return FileReport(path.name, path.stat().st_size, 0, ["left over by an interrupted write or removal"])


def _check_messages(directory: Path, report: Report) -> None:
    # The lock is ours already: recover() reads without taking it.
    recovered = recover(directory, repair=True, read_only=True)
    try:
        index = recovered.index
        report.messages = len(index)
        for message_id, raw in index.entries.items():
            entry = unpack(raw)
            segment = recovered.segments.get(entry.segment)
            try:
                if segment is None:
                    raise StoreError(f"segment {entry.segment} is missing")
                payload = segment.read_payload(entry.offset, entry.length)
                decode_message(payload, 0, len(payload))
            except (StoreError, ValueError, UnicodeDecodeError, OSError) as exc:
                report.unreadable.append(f"{message_id}: {exc}")
    finally:
        for segment in recovered.segments.values():
            segment.close()
        if recovered.log_fd is not None:
            os.close(recovered.log_fd)
