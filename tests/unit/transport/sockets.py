"""Sockets a transport test opens (`opened`), closed after each test by the autouse
fixture this package's conftest takes from here."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

opened: list[socket.socket] = []


@pytest.fixture(autouse=True)
def close_opened_sockets() -> Iterator[None]:
    yield
    while opened:
        opened.pop().close()
