"""`kiteq-server` run as a process: a port another process holds is named, with the option that sets it."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def taken() -> Iterator[str]:
    """host:port of a socket that listens for the whole test."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield f"127.0.0.1:{holder.getsockname()[1]}"


@pytest.mark.parametrize(
    ("flag", "option"),
    [("--bind", "--bind ([server] bind)"), ("--admin-bind", "--admin-bind ([server] admin_bind)")],
)
def test_an_address_in_use_is_named_with_its_option(
    tmp_path: Path, taken: str, flag: str, option: str
) -> None:
    script = Path(sys.executable).with_name("kiteq-server")
    if not script.exists():
        pytest.skip("kiteq-server is not installed in this environment (pip install -e .)")
    addresses = {"--bind": "127.0.0.1:0", "--admin-bind": "127.0.0.1:0", flag: taken}
    result = subprocess.run(
        [str(script), *(part for pair in addresses.items() for part in pair), "--log-level", "error",
         "--store", f"file://{tmp_path}/store", "--registry", f"file://{tmp_path}/registry.json"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        f"kiteq-server: cannot listen on {taken}: address already in use (another kiteq-server?); "
        f"stop what holds it or choose another host:port with {option}\n"
    )
