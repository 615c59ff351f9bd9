"""Free loopback ports and process helpers shared by the service fixtures."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_service(available: bool, what: str) -> None:
    """Skip when a service cannot be had, except in CI where that is a failure."""
    if available:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required in CI but is not installed (make test installs it)")
    pytest.skip(f"{what} is not installed; run `make services`")


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Signal a process by pid and wait for it; SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def wait_for_port(port: int, timeout: float = 30.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout} s")
