"""Sockets a transport test opens (`opened`), closed after each test by the autouse
fixture this package's conftest takes from here; `pair` opens two, connected."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import trio

opened: list[socket.socket] = []


@pytest.fixture(autouse=True)
def close_opened_sockets() -> Iterator[None]:
    yield
    while opened:
        opened.pop().close()


def stream_over(ours: socket.socket) -> trio.SocketStream:
    """`ours` as a Trio stream, closed after the test."""
    opened.append(ours)
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours))


def pair(*, send_buffer: int = 0) -> tuple[trio.SocketStream, socket.socket]:
    """Our end as a Trio stream; the peer's a plain non-blocking socket the test drives."""
    ours, theirs = socket.socketpair()
    if send_buffer:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    theirs.setblocking(False)
    opened.append(theirs)
    return stream_over(ours), theirs
