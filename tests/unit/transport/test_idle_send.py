"""FramedStream on an idle path: a frame is written from the caller's task, the writer
never woken; under load, or behind anything still queued, it waits for the writer as
before, and what the socket does not take goes out next, in order. Deliveries wait for
the writer, unless a turn queues `EAGER_BULK_BYTES` of them while it is idle."""

from __future__ import annotations

import socket

import trio
import trio.testing

from kiteq.transport import EAGER_BULK_BYTES, FramedStream
from tests.helpers import TaskSteps
from tests.unit.transport.sockets import pair


def _read_all(peer: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


async def test_an_idle_frame_reaches_the_peer_without_the_writer() -> None:
    stream, peer = pair()
    framed = FramedStream(stream)  # no write loop runs at all
    framed.send(b"store-ack")
    assert _read_all(peer) == b"store-ack"
    assert framed.bytes_out == len(b"store-ack")


async def test_a_delivery_goes_through_the_writer_even_when_idle() -> None:
    sent: list[object] = []
    stream, peer = pair()
    framed = FramedStream(stream, on_sent=sent.extend)
    framed.send_bulk(b"delivery", "token")
    assert _read_all(peer) == b"" and sent == []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        await trio.testing.wait_all_tasks_blocked()
        framed.finish()
    assert _read_all(peer) == b"delivery" and sent == ["token"]


async def test_under_load_frames_wait_for_the_writer() -> None:
    stream, peer = pair()
    framed = FramedStream(stream, expect_more=lambda: True)
    framed.send(b"a")
    framed.send_bulk(b"b", None)
    assert _read_all(peer) == b"", "nothing written until the writer runs"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        await trio.testing.wait_all_tasks_blocked()
        framed.finish()
    assert _read_all(peer) == b"ab"


async def test_what_the_socket_does_not_take_goes_first_and_in_order() -> None:
    stream, peer = pair(send_buffer=4096)
    framed = FramedStream(stream)
    big = bytes(range(256)) * 4096  # 1 MiB: far more than the socket takes at once
    framed.send(big)
    framed.send(b"after")  # behind the unsent rest: queued, not written past it
    received = bytearray(_read_all(peer))
    assert len(received) < len(big), "the socket took part of it"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        framed.finish()
        while len(received) < len(big) + len(b"after"):
            await trio.testing.wait_all_tasks_blocked()
            received += _read_all(peer)
    assert bytes(received) == big + b"after"


async def test_a_frame_queued_while_the_writer_sends_waits_its_turn() -> None:
    stream, peer = pair(send_buffer=4096)
    framed = FramedStream(stream, expect_more=lambda: True)
    big = b"x" * (1 << 20)
    framed.send(big)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        await trio.testing.wait_all_tasks_blocked()  # the writer is blocked in send_all
        received = bytearray(_read_all(peer))  # room in the socket, the writer not yet woken
        framed.expect_more = lambda: False  # idle now, but the writer holds the socket
        framed.send(b"next")
        framed.finish()
        while len(received) < len(big) + 4:
            await trio.testing.wait_all_tasks_blocked()
            received += _read_all(peer)
    assert bytes(received[-4:]) == b"next" and received.count(b"n") == 1


async def test_a_closed_peer_ends_the_writer_not_the_sender() -> None:
    stream, peer = pair()
    peer.close()
    framed = FramedStream(stream)
    for _ in range(3):  # EPIPE on the first write or the next: never raised here
        framed.send(b"lost")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
    assert framed.closed


async def test_over_tls_or_any_other_stream_frames_go_through_the_writer() -> None:
    stream, peer = pair()
    wrapped = trio.StapledStream(stream, stream)  # any stream but a plain socket
    framed = FramedStream(wrapped)
    framed.send(b"a")
    assert _read_all(peer) == b""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        await trio.testing.wait_all_tasks_blocked()
        framed.finish()
    assert _read_all(peer) == b"a"


async def test_a_flush_the_socket_takes_at_once_costs_the_writer_one_step() -> None:
    # Trio's send_all yields once more after a send that did not wait: a turn of the
    # event loop per flush, which on an idle path each delivery paid for alone.
    stream, peer = pair()
    framed = FramedStream(stream)
    steps = TaskSteps("FramedStream.write_loop")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(steps)
        try:
            for index in range(3):
                framed.send_bulk(b"delivery %d;" % index, index)
                await trio.testing.wait_all_tasks_blocked()
        finally:
            trio.lowlevel.remove_instrument(steps)
        framed.finish()
    assert _read_all(peer) == b"delivery 0;delivery 1;delivery 2;"
    assert steps.steps == 3


async def test_a_writer_that_keeps_finding_frames_still_lets_the_others_run() -> None:
    stream, peer = pair()
    sends: list[object] = []

    def queue_another(tokens: list[object]) -> None:
        sends.extend(tokens)
        if len(sends) < 5:
            framed.send_bulk(b"more;", len(sends))

    framed = FramedStream(stream, on_sent=queue_another)
    steps = TaskSteps("FramedStream.write_loop")
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(framed.write_loop)
            framed.send_bulk(b"first;", 0)
            await trio.testing.wait_all_tasks_blocked()
            framed.finish()
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert _read_all(peer) == b"first;" + b"more;" * 4
    assert steps.steps >= 5, "a step per send: it yielded before each next one"


async def test_a_control_frame_queued_while_the_socket_is_full_waits_for_one_bulk_frame_not_the_send() -> (
    None
):
    # A slow reader's heartbeat replies came behind a whole send's worth of deliveries
    # (256 KiB: over a second at 200 KB/s); now behind what the socket holds and one frame.
    stream, peer = pair(send_buffer=4096)
    sent: list[object] = []
    framed = FramedStream(stream, on_sent=sent.extend)
    frames = [b"%05d" % index + b"." * 995 for index in range(100)]
    for index, frame in enumerate(frames):
        framed.send_bulk(frame, index)
    received = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        await trio.testing.wait_all_tasks_blocked()  # the writer waits for the full socket
        framed.send(b"CONTROL")
        framed.finish()
        while len(received) < 100_000 + len(b"CONTROL"):
            received += _read_all(peer)
            await trio.testing.wait_all_tasks_blocked()
    before = received.index(b"CONTROL")
    assert before % 1000 == 0, "at the end of a bulk frame"
    assert before < 50_000, f"{before} bytes of bulk went ahead of it: the whole send did"
    assert bytes(received[:before] + received[before + len(b"CONTROL") :]) == b"".join(frames)
    assert sent == list(range(100)), "every frame reported sent once, in order"


async def test_a_turns_worth_of_deliveries_reaches_the_peer_before_the_turn_ends() -> None:
    # The broker pushes a producer's burst in one turn of its loop: the consumer gets the
    # first of it while the broker is still at the rest.
    sent: list[object] = []
    stream, peer = pair()
    framed = FramedStream(stream, on_sent=sent.extend)
    frame = b"d" * 1024
    count = EAGER_BULK_BYTES // len(frame)
    for index in range(count - 1):
        framed.send_bulk(frame, index)
    assert _read_all(peer) == b"", "under the bound: left for the writer"
    framed.send_bulk(frame, count - 1)
    assert _read_all(peer) == frame * count, "written by the caller, with no yield"
    assert sent == [], "their timeouts start on the writer's turn"
    framed.send_bulk(b"tail", count)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        await trio.testing.wait_all_tasks_blocked()
        framed.finish()
    assert _read_all(peer) == b"tail"
    assert sent == list(range(count + 1)), "every one reported sent once, in order"


async def test_a_delivery_the_socket_cuts_short_goes_on_first_whole() -> None:
    stream, peer = pair(send_buffer=4096)
    sent: list[object] = []
    framed = FramedStream(stream, on_sent=sent.extend)
    frames = [b"%05d" % index + b"." * 995 for index in range(EAGER_BULK_BYTES // 1000 + 20)]
    for index, frame in enumerate(frames):
        framed.send_bulk(frame, index)
    received = bytearray(_read_all(peer))
    assert 0 < len(received) < EAGER_BULK_BYTES and len(received) % 1000, "a frame was cut short"
    framed.send(b"CONTROL")  # behind the rest of the frame cut short
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        framed.finish()
        while len(received) < 1000 * len(frames) + len(b"CONTROL"):
            await trio.testing.wait_all_tasks_blocked()
            received += _read_all(peer)
    before = received.index(b"CONTROL")
    assert before % 1000 == 0, "at the end of a bulk frame"
    assert bytes(received[:before] + received[before + len(b"CONTROL") :]) == b"".join(frames)
    assert sent == list(range(len(frames))), "every frame reported sent once, in order"


async def test_deliveries_wait_for_the_writer_behind_a_queued_control_frame_or_over_tls() -> None:
    stream, peer = pair()
    busy = FramedStream(stream, expect_more=lambda: True)
    busy.send(b"ack")  # under load: queued for the writer
    other, other_peer = pair()
    wrapped = FramedStream(trio.StapledStream(other, other))  # any stream but a plain socket
    for framed in (busy, wrapped):
        for _ in range(2 * EAGER_BULK_BYTES // 1024):
            framed.send_bulk(b"d" * 1024, None)
    assert _read_all(peer) == b"" and _read_all(other_peer) == b""
