"""The LOCK file: one process at a time has a store directory open.

flock locks belong to an open file description, so a second opener conflicts even
inside the same process, and the kernel drops the lock when its holder dies — a
crashed broker never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from stores.errors import StoreLocked
from stores.file.layout import LOCK_NAME


class DirectoryLock:
    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise StoreLocked naming the holder's pid."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLocked(
                f"the store {self.path.parent} is in use by another process (pid {holder}): stop the broker "
                "that has it open, or give this one another store directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
