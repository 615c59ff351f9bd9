"""FramedStream's reads over TLS: records that came in together reach the owner in one read,
up to a bound, a record not yet whole waits for its rest, and a broken record or the
peer's close_notify after good ones ends the loop once those are read. The peer is a
sans-IO `ssl.SSLObject`, so the test decides which bytes of which records arrive when."""

from __future__ import annotations

import contextlib
import ssl

import trio
import trio.testing
import trustme

from kiteq.transport import TLS_RECORDS_PER_READ, FramedStream
from tests.unit.transport.sockets import pair

FRAMES = [b"one" * 100, b"two" * 100, b"three" * 100]


class Peer:
    """A TLS client that writes its records to the socket as the test says."""

    def __init__(self, sock: trio.socket.SocketType, context: ssl.SSLContext) -> None:
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="broker.test")

    async def handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
            except ssl.SSLWantReadError:
                await self.send(self.outgoing.read())
                self.incoming.write(await self.sock.recv(65536))
            else:
                await self.send(self.outgoing.read())
                return

    def records(self, *frames: bytes) -> bytes:
        """One record per frame, as a client writing each on its own sends them."""
        for frame in frames:
            self.tls.write(frame)
        return self.outgoing.read()

    def close_notify(self) -> bytes:
        with contextlib.suppress(ssl.SSLWantReadError):  # it would wait for ours: the alert is written
            self.tls.unwrap()
        return self.outgoing.read()

    async def send(self, data: bytes) -> None:
        while data:
            data = data[await self.sock.send(data) :]


async def _connected() -> tuple[FramedStream, Peer]:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("broker.test").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    ours, theirs = pair()
    framed = FramedStream(ours)  # as the broker's: made on the TCP stream, TLS once shaken hands
    server = trio.SSLStream(ours, server_context, server_side=True)
    peer = Peer(trio.socket.from_stdlib_socket(theirs), client_context)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        await peer.handshake()
    framed.stream = server
    return framed, peer


class Reads:
    def __init__(self) -> None:
        self.reads: list[bytes] = []

    async def on_data(self, data: bytes | bytearray) -> None:
        self.reads.append(bytes(data))


async def test_records_that_came_in_together_reach_the_owner_in_one_read() -> None:
    framed, peer = await _connected()
    await peer.send(peer.records(*FRAMES) + peer.close_notify())
    reads = Reads()
    with trio.fail_after(10):
        await framed.read_loop(reads.on_data)  # returns at the close_notify
    assert reads.reads == [b"".join(FRAMES)]
    assert framed.bytes_in == sum(len(frame) for frame in FRAMES)


async def test_a_record_not_yet_whole_waits_for_its_rest() -> None:
    framed, peer = await _connected()
    records = peer.records(*FRAMES[:2])
    reads = Reads()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(framed.read_loop, reads.on_data)
            await peer.send(records[:-10])
            await trio.testing.wait_all_tasks_blocked()
            assert reads.reads == [FRAMES[0]]
            await peer.send(records[-10:] + peer.close_notify())
    assert reads.reads == FRAMES[:2]


async def test_a_broken_record_after_good_ones_ends_the_loop_once_they_are_read() -> None:
    framed, peer = await _connected()
    forged = b"\x17\x03\x03\x00\x40" + bytes(64)  # application data that fails its check
    await peer.send(peer.records(*FRAMES[:2]) + forged + peer.records(FRAMES[2]))
    reads = Reads()
    with trio.fail_after(10):
        await framed.read_loop(reads.on_data)  # the broken stream ends it, quietly
    assert reads.reads == [b"".join(FRAMES[:2])]


async def test_a_read_takes_a_bounded_number_of_records() -> None:
    framed, peer = await _connected()
    count = 3 * TLS_RECORDS_PER_READ
    await peer.send(peer.records(*[b"x"] * count) + peer.close_notify())
    reads = Reads()
    with trio.fail_after(10):
        await framed.read_loop(reads.on_data)
    assert b"".join(reads.reads) == b"x" * count
    assert max(len(read) for read in reads.reads) == 1 + TLS_RECORDS_PER_READ
