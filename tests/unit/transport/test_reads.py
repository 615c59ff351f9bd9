"""FramedStream's reads from a plain socket (read directly, not through Trio's stream):
every byte reaches the owner in order, EOF and a reset end the loop, a read that finds
data waiting still yields to the others, and a cancelled reader reads nothing."""

from __future__ import annotations

import socket
import struct

import trio
import trio.testing

from kiteq.transport import FramedStream
from tests.unit.transport.sockets import opened, pair, stream_over


def _framed(stream: trio.SocketStream, read_size: int = 1 << 16) -> FramedStream:
    framed = FramedStream(stream)
    framed.read_size = read_size
    return framed


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        theirs = socket.create_connection(server.getsockname())
        ours, _ = server.accept()
    opened.append(theirs)
    return ours, theirs


async def test_every_byte_reaches_the_owner_in_order_until_eof() -> None:
    stream, theirs = pair()
    framed = _framed(stream, read_size=1000)
    sent = bytes(range(256)) * 40  # ten reads' worth and more
    theirs.sendall(sent)
    theirs.shutdown(socket.SHUT_WR)
    reads: list[bytes] = []

    async def on_data(data: bytes | bytearray) -> None:
        reads.append(bytes(data))

    await framed.read_loop(on_data)  # returns at EOF
    assert b"".join(reads) == sent
    assert max(len(read) for read in reads) <= 1000 and len(reads) >= len(sent) // 1000
    assert framed.bytes_in == len(sent)


async def test_a_peer_that_resets_ends_the_loop_quietly() -> None:
    ours, theirs = _tcp_pair()
    framed = _framed(stream_over(ours))
    theirs.sendall(b"last words")
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reads: list[bytes] = []

    async def on_data(data: bytes | bytearray) -> None:
        reads.append(bytes(data))
        theirs.close()  # with linger 0: a reset, so the next read fails with ECONNRESET

    await framed.read_loop(on_data)
    assert reads == [b"last words"]


async def test_a_read_that_finds_data_waiting_still_lets_the_others_run() -> None:
    stream, theirs = pair()
    framed = _framed(stream, read_size=100)
    theirs.sendall(b"x" * 1000)  # ten reads, each finding data at once
    theirs.shutdown(socket.SHUT_WR)
    turns = 0
    seen: list[int] = []

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await trio.lowlevel.checkpoint()

    async def on_data(data: bytes | bytearray) -> None:
        seen.append(turns)  # never yields itself

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        await framed.read_loop(on_data)
        nursery.cancel_scope.cancel()
    assert len(seen) == 10
    # The other task takes a step every turn of the loop, the reader a read: ten reads span
    # ten turns (Trio orders each turn's tasks at random: the first and last turns' may
    # or may not count). Not yielding, all ten would be read in one turn.
    assert seen[-1] - seen[0] >= len(seen) - 2, seen


async def test_a_cancelled_reader_reads_nothing() -> None:
    stream, theirs = pair()
    framed = _framed(stream)
    theirs.sendall(b"keep me")
    reads: list[bytes] = []

    async def on_data(data: bytes | bytearray) -> None:
        reads.append(bytes(data))
        theirs.close()

    with trio.CancelScope() as scope:
        scope.cancel()
        await framed.read_loop(on_data)
    assert reads == [], "cancelled before reading"
    await framed.read_loop(on_data)
    assert reads == [b"keep me"], "what was not read is still there for the next read"


async def test_a_reader_waiting_for_data_is_woken_by_it() -> None:
    stream, theirs = pair()
    framed = _framed(stream)
    reads: list[bytes] = []

    async def on_data(data: bytes | bytearray) -> None:
        reads.append(bytes(data))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.read_loop, on_data)
        await trio.testing.wait_all_tasks_blocked()
        assert reads == []
        theirs.sendall(b"hello")
        theirs.shutdown(socket.SHUT_WR)
    assert reads == [b"hello"]
