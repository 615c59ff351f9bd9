"""One message's events, read back from the end of a delivery log and its rotated files.

The broker's log is rotated to `<path>.1` … `<path>.N` (kiteq/delivery_log.py), newest
first, each up to `delivery_log_max_bytes` (64 MiB). A trace is asked for while the
broker runs, so the read is bounded twice: at most `max_bytes` from the ends of the
files (newest file first), and at most `limit` events (the newest kept). Lines are
matched on the id's text before being parsed, so bytes of other messages cost a
substring search, not a JSON parse. Plain blocking file reads: the caller runs it in
a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MiB = 1024 * 1024
TRACE_BYTES = 16 * MiB
TRACE_EVENTS = 500
ROTATED_FILES = 5  # DeliveryLog's default `backups`


@dataclass(slots=True)
class Trace:
    """The events found (oldest first) and how far the search went."""

    events: list[dict[str, object]] = field(default_factory=list)
    bytes_read: int = 0
    complete: bool = True  # False: the byte budget ended before the oldest file's start
    truncated: bool = False  # True: more events than `limit`, the oldest left out


def log_files(path: Path, rotated: int = ROTATED_FILES) -> Iterator[Path]:
    """The current file, then `.1` … `.rotated`: newest first, those that exist."""
    for candidate in (path, *(path.with_name(f"{path.name}.{n}") for n in range(1, rotated + 1))):
        if candidate.exists():
            yield candidate


def trace(path: Path, message_id: str, *, max_bytes: int = TRACE_BYTES, limit: int = TRACE_EVENTS) -> Trace:
    """The events of `message_id` in the last `max_bytes` of the log at `path`, oldest first."""
    found = Trace()
    needle = f'"message_id":"{message_id}"'.encode()
    newest_first: list[list[dict[str, object]]] = []
    for file in log_files(path):
        budget = max_bytes - found.bytes_read
        if budget <= 0:
            found.complete = False
            break
        events, read, whole = _events_in(file, needle, budget)
        found.bytes_read += read
        newest_first.append(events)
        if not whole:
            found.complete = False
            break
    events = [event for chunk in reversed(newest_first) for event in chunk]
    if len(events) > limit:
        found.truncated = True
        events = events[-limit:]
    found.events = events
    return found


def _events_in(file: Path, needle: bytes, budget: int) -> tuple[list[dict[str, object]], int, bool]:
    """(events of the lines holding `needle` in the last `budget` bytes, bytes read, whole file read)."""
    try:
        with open(file, "rb") as handle:
            size = handle.seek(0, 2)
            start = max(0, size - budget)
            handle.seek(start)
            data = handle.read(size - start)
    except OSError:  # rotated away between the listing and the read
        return [], 0, True
    lines = data.split(b"\n")
    if start:
        lines = lines[1:]  # the first line is cut: the budget began inside it
    events = []
    for line in lines:
        if needle in line:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn last line while the broker writes: skipped, as reconcile does
            if isinstance(event, dict):
                events.append(event)
    return events, len(data), start == 0
