"""The file store's options, from its URI query and from keyword arguments.

`file:///var/kiteq/store?fsync=batch&segment_bytes=64MiB&repair=false`; keyword
arguments to `FileStore.from_uri` override the URI. A bad value stops the store
before it touches the disk, with a message naming the option.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from stores.errors import StoreConfigError
from stores.file.writer import FsyncMode
from stores.uri import split_file_uri

MIB = 1 << 20
# Offsets are u32 in the index: a segment (plus one oversized record) must stay well under 4 GiB.
MAX_SEGMENT_BYTES = 1 << 30
MIN_SEGMENT_BYTES = 1024
DEFAULT_SEGMENT_BYTES = 64 * MIB
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]i?b?)?\s*$", re.IGNORECASE)
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclass(frozen=True, slots=True)
class FileStoreOptions:
    """fsync: when calls are durable; segment_bytes: size at which a data segment is sealed;
    repair: keep every readable record past mid-file damage instead of refusing to start;
    read_only: open for offline inspection (nothing written, torn tails left alone);
    compact_bytes: log size that triggers a snapshot; cache_bytes: recent payloads kept in memory;
    write_in_place: a waited-on batch may be written on the event loop's thread when it is idle;
    preallocate: the next data segment is zero-filled ahead (preallocation.py; not with fsync=never);
    cache_sealed: a sealed data segment's pages stay in the page cache (by default they are dropped).
    """

    fsync: FsyncMode = FsyncMode.BATCH
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    repair: bool = False
    read_only: bool = False
    compact_bytes: int = 64 * MIB
    cache_bytes: int = 16 * MIB
    write_in_place: bool = True
    preallocate: bool = True
    cache_sealed: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, object]) -> FileStoreOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise StoreConfigError(
                f"unknown file store option(s) {', '.join(unknown)}: use {', '.join(sorted(known))}"
            )
        values: dict[str, object] = {}
        for name, value in raw.items():
            if name == "fsync":
                values[name] = _fsync(value)
            elif name in ("repair", "read_only", "write_in_place", "preallocate", "cache_sealed"):
                values[name] = _bool(name, value)
            else:
                values[name] = _size(name, value)
        segment_bytes = values.get("segment_bytes", DEFAULT_SEGMENT_BYTES)
        if not isinstance(segment_bytes, int) or not MIN_SEGMENT_BYTES <= segment_bytes <= MAX_SEGMENT_BYTES:
            raise StoreConfigError(
                f"segment_bytes={segment_bytes} is out of range: use {MIN_SEGMENT_BYTES} to {MAX_SEGMENT_BYTES} (1GiB)"
            )
        return cls(**values)  # type: ignore[arg-type]


def parse_uri(uri: str, overrides: Mapping[str, object]) -> tuple[Path, FileStoreOptions]:
    """The directory and options of a `file://` store URI; `overrides` win over the query."""
    try:
        directory, query = split_file_uri(uri)
    except ValueError as exc:
        raise StoreConfigError(str(exc)) from exc
    return directory, FileStoreOptions.parse({**query, **overrides})


def _fsync(value: object) -> FsyncMode:
    try:
        return FsyncMode(str(value).lower())
    except ValueError:
        raise StoreConfigError(f"fsync={value!r} is not a mode: use always, batch or never") from None


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in _TRUE | _FALSE:
        return text in _TRUE
    raise StoreConfigError(f"{name}={value!r} is not a boolean: use true or false")


def _size(name: str, value: object) -> int:
    """Bytes from an int or '64MiB', '512k', '1g' (binary units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise StoreConfigError(
                f"{name}={value!r} is not a size: use bytes, or a number with KiB, MiB or GiB"
            )
        unit = (match.group(2) or "").lower()[:1]
        number = int(match.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[unit]
    if number < 0:
        raise StoreConfigError(f"{name}={value!r} must not be negative")
    return number
