"""`file:///path/dir`: the durable single-broker store (see stores/file/store.py and docs/file-store.md)."""

from stores.file.options import FileStoreOptions
from stores.file.store import FileStore
from stores.file.writer import FsyncMode

__all__ = ["FileStore", "FileStoreOptions", "FsyncMode"]
