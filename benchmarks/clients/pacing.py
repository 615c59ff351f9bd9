"""An alarm for paced sends that goes off on time, not at the event loop's next millisecond.

Both producers' event loops (Trio's, pika's) wait in `epoll.poll`, which CPython rounds up
to whole milliseconds. A send due in 0.2 ms then leaves when something else wakes the
loop (a store-ack, a confirm) or at the next millisecond: the offered load came in lumps
whose timing depended on the broker's acks, and a producer's own lateness counted as the
broker's latency. A timerfd armed for the send's due time is a file descriptor both loops
wait on like a socket, and it wakes them within microseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time

_CLOCK_MONOTONIC = 1  # what time.perf_counter reads on Linux
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1
_NANOS = 1_000_000_000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.timerfd_settime.argtypes = [
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(_Itimerspec),
    ctypes.POINTER(_Itimerspec),
]

if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
    raise RuntimeError("pacing needs time.perf_counter to read CLOCK_MONOTONIC (Linux)")


class Alarm:
    """A one-shot timerfd: `set(at)` for a `time.perf_counter()` instant; the descriptor is
    readable from then until `clear()`."""

    def __init__(self) -> None:
        fd = _libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self.fd: int = fd

    def set(self, at: float) -> None:
        """Go off at `at` (seconds on time.perf_counter's clock; at once if past)."""
        nanos = max(int(at * _NANOS), 1)  # all zeros would disarm it
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(nanos // _NANOS, nanos % _NANOS))
        if _libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) < 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")

    def clear(self) -> None:
        """Acknowledge the alarm, so the descriptor is no longer readable."""
        with contextlib.suppress(BlockingIOError):  # not gone off, or cleared already
            os.read(self.fd, 8)

    def close(self) -> None:
        os.close(self.fd)
