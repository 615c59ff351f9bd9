"""The C allocator's settings for a broker that holds a large index.

glibc serves a request of 128 KiB or more with an mmap of its own, returned to the
system when freed; but the first time such a block is freed it raises that threshold
to the block's size (up to 32 MiB). A backlog's index doubles its tables as it grows (a
dict of a million ids is tens of MiB), so once an old table is freed, later tables and
every large transient buffer (a batch of records being written, a long read) are cut
from the heap instead, and the holes they leave between long-lived objects stay
resident. Measured with a 1,000,000-message backlog: 257 to 260 bytes of resident memory
per stored message with the threshold left to move, 248.5 to 249.8 with it fixed here.

Fixed at 1 MiB, buffers below it stay in the heap (no system call each) and the index's
tables go to mmap, from where a freed one goes back to the system. An operator who set
`MALLOC_MMAP_THRESHOLD_` keeps that setting.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 1 << 20
M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h
OPERATOR_SETTING = "MALLOC_MMAP_THRESHOLD_"


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD; False where there is nothing to do
    (another C library, or the operator's own setting in the environment)."""
    if not _glibc() or OPERATOR_SETTING in os.environ:
        return False
    return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):  # a C library without the name, or without confstr
        return False
