"""Garbage-collector settings for a process that moves messages.

Every message allocates a few dozen short-lived objects (frames, protobuf wrappers,
entities, rounds). With CPython's default first-generation threshold of 700 the
cyclic collector then runs every few messages, and each run walks the young
objects of all the hundreds of requests in flight: measured end to end, about a
tenth of the broker's and the clients' CPU. Reference counting frees nearly all of
these objects anyway; the collector only has to find the rare cycles, so running it
thirty times less often costs a little memory (bounded by the threshold) and no
correctness.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def tune_gc() -> None:
    """Collect the young generation every YOUNG_THRESHOLD allocations, and never re-scan
    what exists at startup (modules, configuration): `gc.freeze` moves it out of the
    collector's reach for good."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
