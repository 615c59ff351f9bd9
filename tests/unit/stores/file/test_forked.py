"""A forked child does its work and reports back, holds none of its parent's descriptors,
and does not outlive its parent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from stores.file import forked


def fd_is_open(fd: int) -> int:
    try:
        os.fstat(fd)
    except OSError:
        return 0
    return 1


def reaped(pid: int) -> bool:
    """True once nothing is left of child `pid` to wait for (no zombie); never blocks."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def fail() -> int:
    raise ValueError("no room on the device")


def sleep_long() -> int:
    time.sleep(60)
    return 0


@pytest.mark.parametrize(
    ("work", "returns", "raises"),
    [
        (lambda: 42, 42, None),
        (fail, None, r"exited with status 1: ValueError: no room on the device"),
        (lambda: os._exit(3), None, r"exited with status 3: it reported nothing"),
    ],
)
def test_the_child_reports_what_its_work_returned_or_why_it_failed(
    work: Callable[[], int], returns: int | None, raises: str | None
) -> None:
    child = forked.start(work)
    if raises is None:
        assert child.wait() == returns
    else:
        with pytest.raises(OSError, match=raises):
            child.wait()
        with pytest.raises(OSError, match=raises):  # the result is kept
            child.wait()


def refuse_to_fork() -> int:
    raise BlockingIOError(11, "Resource temporarily unavailable")


def test_a_refused_fork_is_raised_and_leaks_no_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fork", refuse_to_fork)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(BlockingIOError, match="Resource temporarily unavailable"):
        forked.start(lambda: 0)
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_killed_child_is_reaped_and_says_so() -> None:
    child = forked.start(sleep_long)
    child.kill()
    with pytest.raises(OSError, match="was killed by SIGKILL"):
        child.wait()
    assert reaped(child.pid)  # no zombie left behind


def test_the_child_holds_none_of_its_parents_descriptors() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        high = os.dup2(listener.fileno(), 900)  # above the report pipe's descriptors too
        try:
            child = forked.start(lambda: fd_is_open(high) + fd_is_open(listener.fileno()))
            assert child.wait() == 0
        finally:
            os.close(high)


def test_the_child_outlives_a_stop_sent_to_its_process_group(tmp_path: Path) -> None:
    fifo = tmp_path / "go"
    os.mkfifo(fifo)

    def read_go() -> int:
        with open(fifo, "rb") as go:  # opened after the child set its signals up
            return len(go.read())

    child = forked.start(read_go)
    with open(fifo, "wb") as go:  # returns once the child has opened its end
        os.kill(child.pid, signal.SIGTERM)
        os.kill(child.pid, signal.SIGINT)
        go.write(b"done")
    assert child.wait() == 4


PARENT = """
import sys
from stores.file import forked
from tests.unit.stores.file.test_forked import sleep_long
child = forked.start(sleep_long)
print(child.pid, flush=True)
"""


async def test_the_child_dies_with_its_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())  # not read to its end: the child may hold the pipe
    assert parent.wait(timeout=30) == 0
    parent.stdout.close()
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # gone already
    try:
        with trio.fail_after(10):
            await trio.lowlevel.wait_readable(pidfd)  # readable once the process has ended
    finally:
        os.close(pidfd)
