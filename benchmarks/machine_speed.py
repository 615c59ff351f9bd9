"""How fast the machine ran while a run measured, recorded beside its figures.

The machines these benchmarks run on differ up to 4x in speed, and one machine's speed swings
within minutes: figures from two runs compare only with the machine's speed beside them.
So every run reads, before and after its suites, what one step of a pure-Python loop and
one system call cost (the broker, its clients and pika are bound by both). A run whose
readings are twice another's ran on a machine twice as slow.

A machine's speed after idleness differs from its speed under load, and paced figures meet
it on every message: a process that sleeps between messages wakes up slow (its core gone
idle, its caches cold; on a virtual machine, its virtual CPU halted). On one machine here a
5 ms pause made a round trip between two processes 3-5x as long and a 40 us piece of
Python 2-2.5x, and a broker handling 200 messages a second spent 0.8-1.2 ms of CPU on
each, against 0.19 ms at 5,000 a second (docs/performance-history.md). So a reading also
times round trips and a small task both back to back and after such a pause
(`wake_reading`).

The interpreter's build counts as much as the machine: on one machine the same code ran
end to end 1.4x as fast on Debian's own python3.11 (libpython linked into the executable)
as on a pyenv build that loads libpython3.11.so (docs/performance-history.md). So a run also
records which interpreter ran it (`interpreter`).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

LOOP_STEPS = 1_000_000
SYSCALLS = 100_000
# Each figure is the fastest of this many readings: the one least disturbed by other work.
READINGS = 5
# Wake-up costs: the median of this many timings each, back to back and after IDLE of sleep
# (a paced client's pause between sends at 200 a second).
WAKE_TIMINGS = 100
IDLE = 0.005
# The other end of the round trips: echoes what it reads on the socket it was handed. A
# round trip it has not answered within ECHO_TIMEOUT seconds fails the reading.
ECHO = "import socket, sys\nend = socket.socket(fileno=int(sys.argv[1]))\nwhile data := end.recv(64):\n    end.sendall(data)\n"
ECHO_TIMEOUT = 10.0


def reading() -> dict[str, float]:
    """Nanoseconds per step of a pure-Python loop and per system call (getppid), and the
    costs of waking up (`wake_reading`)."""
    return {
        "python_loop_step_ns": round(min(_loop_step_ns() for _ in range(READINGS)), 1),
        "syscall_ns": round(min(_syscall_ns() for _ in range(READINGS)), 1),
        **wake_reading(),
    }


def wake_reading() -> dict[str, float]:
    """Microseconds per round trip over a Unix socket to a process that blocks in between,
    back to back and after IDLE of sleep; and how many times as long a small piece of
    pure Python takes right after IDLE of sleep as back to back."""
    with _echo_process() as end:
        back_to_back, after_idle = _timed(partial(_round_trip, end))
    task_back_to_back, task_after_idle = _timed(_small_task)
    return {
        "round_trip_us": round(back_to_back * 1e6, 1),
        "round_trip_after_idle_us": round(after_idle * 1e6, 1),
        "python_after_idle_ratio": round(task_after_idle / task_back_to_back, 2),
    }


def _timed(step: Callable[[], float]) -> tuple[float, float]:
    """The median of `step`'s own timings (seconds), back to back and each after IDLE."""
    step()  # the first warms up
    back_to_back = [step() for _ in range(WAKE_TIMINGS)]
    after_idle = []
    for _ in range(WAKE_TIMINGS):
        time.sleep(IDLE)
        after_idle.append(step())
    return statistics.median(back_to_back), statistics.median(after_idle)


@contextmanager
def _echo_process() -> Iterator[socket.socket]:
    """Our end of a socket whose other end a child process echoes; the child exits once
    ours is shut for writing, and is waited for."""
    ours, theirs = socket.socketpair()
    ours.settimeout(ECHO_TIMEOUT)
    with ours:
        with theirs:
            child = subprocess.Popen(
                [sys.executable, "-c", ECHO, str(theirs.fileno())], pass_fds=[theirs.fileno()]
            )
        try:
            yield ours
        except BaseException:
            child.kill()  # it may be the one that failed to answer
            raise
        finally:
            ours.shutdown(socket.SHUT_WR)
            child.wait()


def _round_trip(end: socket.socket) -> float:
    started = time.perf_counter()
    end.sendall(b"x")
    end.recv(64)
    return time.perf_counter() - started


def _small_task() -> float:
    """About 40 us of Python where a loop step takes 45 ns."""
    started = time.perf_counter()
    sorted([str(number) for number in range(150)], reverse=True)
    return time.perf_counter() - started


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
