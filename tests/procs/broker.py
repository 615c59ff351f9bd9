"""A `kiteq-server` child process that tests can kill and restart on the same port and store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.services.ports import free_port, wait_for_port


def server_command(address: str, store: str, registry: str, *extra: str, admin: str = "") -> list[str]:
    """`python -m kiteq.cli.server` on `address` with a store and registry; admin off unless given."""
    return [
        sys.executable,
        "-m",
        "kiteq.cli.server",
        "--bind",
        address,
        "--admin-bind",
        admin,
        "--store",
        store,
        "--registry",
        registry,
        *extra,
    ]


class BrokerProcess:
    def __init__(
        self, workdir: Path, registry: str, *, store: str | None = None, extra: tuple[str, ...] = ()
    ) -> None:
        self.workdir = workdir
        self.registry = registry
        self.store = store or f"file://{workdir}/store?fsync=batch"
        self.port = free_port()
        self.admin_port = free_port()
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None
        self.log = workdir / "broker.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        command = server_command(
            self.address, self.store, self.registry, *self.extra, admin=f"127.0.0.1:{self.admin_port}"
        )
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, cwd=self.workdir, env={**os.environ}, stderr=log)
        await trio.to_thread.run_sync(wait_for_port, self.port)

    async def stats(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.admin_port}/stats"
        return await trio.to_thread.run_sync(lambda: httpx.get(url, timeout=10).json())

    async def wait_bindings(self, count: int, timeout: float = 10.0) -> None:
        """Wait until the broker routes by `count` bindings (messages stored before go elsewhere)."""
        with trio.fail_after(timeout):
            while len((await self.stats())["lanes"]) < count:
                await trio.sleep(0.05)

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        return await trio.to_thread.run_sync(self.process.wait, 30)

    async def kill(self) -> int:
        return await self.stop(signal.SIGKILL)
