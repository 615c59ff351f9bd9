"""FramedStream's writer: frames queued together go out in one send, and under load
(the owner expects more) a flush waits out FLUSH_INTERVAL after the previous one."""

from __future__ import annotations

import trio
import trio.testing

from kiteq.transport import FLUSH_INTERVAL, FLUSH_NOW_BYTES, FramedStream


class RecordingStream(trio.abc.HalfCloseableStream):
    """A stream that records (virtual time, bytes) of every send_all."""

    def __init__(self) -> None:
        self.sends: list[tuple[float, bytes]] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        self.sends.append((trio.current_time(), bytes(data)))

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def _send_twice(expect_more: bool, second: bytes = b"second") -> list[tuple[float, bytes]]:
    stream = RecordingStream()
    framed = FramedStream(stream, expect_more=lambda: expect_more)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        framed.send(b"a")
        framed.send(b"b")
        await trio.testing.wait_all_tasks_blocked()
        framed.send(second)
        await trio.sleep(1)
        framed.finish()
    return stream.sends


async def test_frames_queued_together_go_out_in_one_send(autojump_clock: trio.abc.Clock) -> None:
    sends = await _send_twice(expect_more=False)
    assert [data for _, data in sends] == [b"ab", b"second"]


async def test_one_request_at_a_time_is_never_held_back(autojump_clock: trio.abc.Clock) -> None:
    (first, _), (second, _) = await _send_twice(expect_more=False)
    assert second - first < FLUSH_INTERVAL / 10


async def test_under_load_a_flush_waits_out_the_interval(autojump_clock: trio.abc.Clock) -> None:
    (first, _), (second, _) = await _send_twice(expect_more=True)
    assert second - first >= FLUSH_INTERVAL


async def test_a_full_outbox_goes_out_at_once_even_under_load(autojump_clock: trio.abc.Clock) -> None:
    (first, _), (second, _) = await _send_twice(expect_more=True, second=b"x" * FLUSH_NOW_BYTES)
    assert second - first < FLUSH_INTERVAL / 10
