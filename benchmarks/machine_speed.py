"""How fast the machine ran while a run measured, recorded beside its figures.

The machines these benchmarks run on differ up to 4x in speed, and one machine's speed swings
within minutes: figures from two runs compare only with the machine's speed beside them.
So every run reads, before and after its suites, what one step of a pure-Python loop and
one system call cost (the broker, its clients and pika are bound by both). A run whose
readings are twice another's ran on a machine twice as slow.

The interpreter's build counts as much as the machine: on one machine the same code ran
end to end 1.4x as fast on Debian's own python3.11 (libpython linked into the executable)
as on a pyenv build that loads libpython3.11.so (docs/performance.md). So a run also
records which interpreter ran it (`interpreter`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

LOOP_STEPS = 1_000_000
SYSCALLS = 100_000
# Each figure is the fastest of this many readings: the one least disturbed by other work.
READINGS = 5


def reading() -> dict[str, float]:
    """Nanoseconds per step of a pure-Python loop and per system call (getppid)."""
    return {
        "python_loop_step_ns": round(min(_loop_step_ns() for _ in range(READINGS)), 1),
        "syscall_ns": round(min(_syscall_ns() for _ in range(READINGS)), 1),
    }


def _loop_step_ns() -> float:
    started = time.perf_counter_ns()
    total = 0
    for step in range(LOOP_STEPS):
        total += step
    return (time.perf_counter_ns() - started) / LOOP_STEPS


def _syscall_ns() -> float:
    started = time.perf_counter_ns()
    for _ in range(SYSCALLS):
        os.getppid()
    return (time.perf_counter_ns() - started) / SYSCALLS


def interpreter() -> dict[str, object]:
    """The Python that ran the suites (and the broker and clients they start, `sys.executable`):
    its path, and whether it loads libpython as a shared library (as the pyenv build of
    `--enable-shared` that ran the slower figures does) or has it linked in (as Debian's
    /usr/bin/python3.11 does)."""
    return {
        "executable": os.path.realpath(sys.executable),
        "libpython_shared": "libpython" in Path("/proc/self/maps").read_text(),
    }
