"""FramedStream's writer: frames queued together go out in one send; under load (the
owner expects more) the tasks ready at the same moment add theirs first; nothing ever
waits on a timer."""

from __future__ import annotations

from collections.abc import Callable

import trio
import trio.testing

from kiteq.transport import FramedStream
from tests.helpers import TaskSteps


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


async def test_no_flush_waits_for_time_to_pass(autojump_clock: trio.abc.Clock) -> None:
    for expect_more in (False, True):
        (first, _), (second, _) = await _send_twice(expect_more=expect_more)
        assert second == first, "an idle path flushes at once, loaded or not"


async def _queued_by_two_tasks(expect_more: bool) -> list[bytes]:
    """Two tasks made ready at the same moment each queue a frame after the writer woke."""
    stream = RecordingStream()
    framed = FramedStream(stream, expect_more=lambda: expect_more)
    go = trio.Event()

    async def queue(data: bytes) -> None:
        await go.wait()
        framed.send(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        nursery.start_soon(queue, b"x")
        nursery.start_soon(queue, b"y")
        await trio.testing.wait_all_tasks_blocked()
        framed.send(b"w")
        go.set()
        await trio.testing.wait_all_tasks_blocked()
        framed.finish()
    return [data for _, data in stream.sends]


async def test_under_load_frames_of_tasks_ready_together_share_a_send(autojump_clock: trio.abc.Clock) -> None:
    [sent] = await _queued_by_two_tasks(expect_more=True)
    assert sent[:1] == b"w" and sorted(sent[1:]) == [ord("x"), ord("y")], "one send; the two in Trio's order"


async def _steps_from_wake_to_send(queue: Callable[[FramedStream], None]) -> int:
    """Steps the writer takes from being woken by `queue` to calling send_all, under load."""
    steps = TaskSteps("FramedStream.write_loop")
    at_send: list[int] = []

    class CountingStream(RecordingStream):
        async def send_all(self, data: bytes | bytearray | memoryview) -> None:
            at_send.append(steps.steps)
            await super().send_all(data)

    framed = FramedStream(CountingStream(), expect_more=lambda: True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(framed.write_loop)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.add_instrument(steps)
        queue(framed)
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.remove_instrument(steps)
        framed.finish()
    return at_send[0]


async def test_deliveries_go_out_without_letting_other_ready_tasks_run_first() -> None:
    # A pump queues deliveries in bursts already; letting every ready task run first put the
    # consumer's next deliveries behind the broker's bookkeeping (outcomes, pages to read).
    assert await _steps_from_wake_to_send(lambda framed: framed.send(b"ack")) == 2, "control: one yield"
    assert await _steps_from_wake_to_send(lambda framed: framed.send_bulk(b"delivery", None)) == 1
