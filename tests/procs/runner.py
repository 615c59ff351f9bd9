"""Run a test client script as a real process and read its line-by-line reports."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]


class ClientProcess:
    """A `tests/procs/<script>.py` child whose stdout lines are collected as they come."""

    def __init__(self, script: str, *args: str) -> None:
        self.command = [sys.executable, str(ROOT / "tests" / "procs" / f"{script}.py"), *args]
        self.lines: list[str] = []
        self.process: trio.Process | None = None

    async def run(self, *, task_status: trio.TaskStatus[ClientProcess] = trio.TASK_STATUS_IGNORED) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        async with trio.open_nursery() as nursery:
            self.process = await nursery.start(
                functools.partial(
                    trio.run_process, self.command, stdout=subprocess.PIPE, check=False, env=env
                )
            )
            task_status.started(self)
            buffer = b""
            assert self.process.stdout is not None
            async for chunk in self.process.stdout:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                self.lines.extend(line.decode() for line in complete)

    def words(self, verb: str) -> list[str]:
        return [line.split(" ", 1)[1] for line in self.lines if line.startswith(verb + " ")]

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
