"""Work done in a forked child process, beside the event loop instead of under its GIL.

A snapshot encodes every entry of the index in Python: about a third of a second of CPU
at a million messages. In a thread it holds the GIL nearly all that time, and the event loop,
which lets the GIL go at each syscall, waits to get it back each time: in a micro-run the
loop was held off for 0.45 s of the 0.52 s that a million-entry encode took, and a backlog's
sends slowed down at every snapshot. A child forked at the cut runs on a core of its own,
from a copy-on-write image of the parent: it reads the index exactly as it was, and the Trio
thread copies nothing (a fork of a 440 MB process took 7-10 ms here, a copy of a
million-entry dict 35 ms). It is how Redis writes its snapshots (BGSAVE).

The child does only its `work`. It first closes every descriptor it inherited (a listening
socket or the store's LOCK held by a child would outlive a restart of the broker), ignores
SIGINT and SIGTERM (its parent stops gracefully and waits for it), dies with its parent
(PR_SET_PDEATHSIG: a kill -9 of the broker leaves no child writing), and always ends in
`os._exit`, never returning into the parent's code. What it reports travels back
through a pipe: the number `work` returned, or why it failed.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
from collections.abc import Callable
from contextlib import suppress

PR_SET_PDEATHSIG = 1
# Looked up now, in the parent: in the child a dlopen or dlsym could wait for a loader lock
# that another thread of the parent held at the fork, for ever.
_PRCTL: Callable[..., int] | None = (
    ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
)
# How much of a failed child's explanation is kept.
REPORT_LIMIT = 2000


class Forked:
    """A child process running one piece of work; `wait` (blocking) for its result."""

    def __init__(self, pid: int, report_fd: int) -> None:
        self.pid = pid
        self._report_fd = report_fd
        self._result: int | OSError | None = None

    def wait(self) -> int:
        """Block until the child ends: the number its work returned, or OSError saying why not."""
        if self._result is None:
            self._result = self._reap()
        if isinstance(self._result, OSError):
            raise self._result
        return self._result

    def kill(self) -> None:
        """Stop the child now (its work is no longer wanted) and reap it."""
        if self._result is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._result = self._reap()

    def _reap(self) -> int | OSError:
        chunks = []
        try:
            while chunk := os.read(self._report_fd, 4096):
                chunks.append(chunk)
        finally:
            os.close(self._report_fd)
        _, status = os.waitpid(self.pid, 0)
        report = b"".join(chunks).decode(errors="replace")
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return int(report)
        if os.WIFSIGNALED(status):
            ended = f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            ended = f"exited with status {os.WEXITSTATUS(status)}"
        return OSError(f"child process {self.pid} {ended}: {report or 'it reported nothing'}")


def start(work: Callable[[], int]) -> Forked:
    """Run `work` in a forked child. OSError if the system refuses (no process or descriptor
    to spare, no memory to commit): the caller does the work another way."""
    report_read, report_write = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(report_read)
        os.close(report_write)
        raise
    if pid == 0:
        _child(work, report_write, parent)
    os.close(report_write)
    return Forked(pid, report_read)


def _child(work: Callable[[], int], report_fd: int, parent: int) -> None:
    """The child's whole life: never returns, whatever happens."""
    status = 1
    try:
        try:
            _die_with_parent()
            if os.getppid() != parent:
                raise OSError("the parent died before its child started")
            os.closerange(3, report_fd)
            os.closerange(report_fd + 1, os.sysconf("SC_OPEN_MAX"))
            with suppress(ValueError):  # the child's one thread is its main thread; if not, they stay
                signal.set_wakeup_fd(-1)  # the parent's event loop's, closed above
                # The parent decides when the child ends. A Ctrl-C or a stop reaches the whole
                # process group (systemd signals the whole unit): the broker then stops
                # gracefully and waits for its snapshot, which is not thrown away.
                for signum in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(signum, signal.SIG_IGN)
            # A collection would touch every object of the parent's heap: each touched page is
            # then copied, and the child would take as much memory again.
            gc.disable()
            report = str(work())
            status = 0
        except BaseException as exc:
            report = f"{type(exc).__name__}: {exc}"[:REPORT_LIMIT]
        os.write(report_fd, report.encode())
    finally:
        os._exit(status)


def _die_with_parent() -> None:
    if _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
