"""Message stores behind one interface; `open_store(uri)` picks one by URI scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from stores.base import Cursor, DeadLetter, DeliveryUpdate, MessageStore, Page, SharedStore, Stage, StoreStats
from stores.entity import BYTES, STRING, MessageEntity, entity_from_wire
from stores.errors import (
    StoreConfigError,
    StoreCorrupted,
    StoreError,
    StoreLocked,
    StoreStalled,
    StoreUnavailable,
)


def open_store(uri: str, **options: object) -> MessageStore:
    """Create (not start) the store named by `uri`: memory://, file://DIR, mysql://…"""
    scheme = urlsplit(uri).scheme
    if scheme == "memory":
        from stores.memory import MemoryStore

        return MemoryStore(uri)
    if scheme == "file":
        from stores.file import FileStore

        return FileStore.from_uri(uri, **options)
    if scheme == "mysql":
        from stores.mysql import MySQLStore

        return MySQLStore.from_uri(uri, **options)
    raise StoreConfigError(
        f"unknown store URI {uri!r}: use memory://, file:///path/dir or mysql://user:pass@host:port/db"
    )


__all__ = [
    "BYTES",
    "STRING",
    "Cursor",
    "DeadLetter",
    "DeliveryUpdate",
    "MessageEntity",
    "MessageStore",
    "Page",
    "SharedStore",
    "Stage",
    "StoreConfigError",
    "StoreCorrupted",
    "StoreError",
    "StoreLocked",
    "StoreStalled",
    "StoreStats",
    "StoreUnavailable",
    "entity_from_wire",
    "open_store",
]
