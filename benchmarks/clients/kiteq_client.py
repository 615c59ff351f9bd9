"""KiteQ-py side of versus_rabbitmq: the project's Producer or Consumer in a process of its own.

`produce`: `--window` sender tasks share one Producer, each sending its next message
once the previous one is stored. `consume`: one Consumer of the group whose persistent
binding (watermark = `--window`) the benchmark registered; listeners run up to
`--window` at once. Prints `ready` once connected (consume), then a JSON report.
"""

from __future__ import annotations

import math

import trio

from benchmarks.clients.workload import (
    CONSUMER_GROUP,
    MESSAGE_TYPE,
    PRODUCER_GROUP,
    TOPIC,
    Sends,
    Tally,
    arguments,
    emit,
)
from kiteq import Binding, Consumer, Message, MessageListener, Producer
from kiteq.gc_tuning import tune_gc
from kiteq.logging import configure_logging
from tests.faults.resend import send_until_stored


async def release(sends: Sends, tickets_in: trio.MemorySendChannel[int]) -> None:
    """Hand out send numbers as they fall due: one wake-up releases all that are due."""
    async with tickets_in:
        for index in range(sends.count):
            delay = sends.delay(index)
            if delay > 0:
                await trio.sleep(delay)
            tickets_in.send_nowait(index)


async def next_ticket(tickets: trio.MemoryReceiveChannel[int]) -> int | None:
    """The next send number, None once all are handed out. One already due is taken
    without yielding: the channel's `receive` yields even then, a turn of the event loop
    per message that the harness added and pika's publish loop does not have (the send
    that follows waits for its store-ack, so the sender still yields once a message)."""
    try:
        return tickets.receive_nowait()
    except trio.WouldBlock:
        try:
            return await tickets.receive()
        except trio.EndOfChannel:
            return None
    except trio.EndOfChannel:
        return None


async def produce(target: str, sends: Sends, window: int, timeout: float) -> dict[str, object]:
    tickets_in, tickets = trio.open_memory_channel[int](math.inf)
    async with Producer(target, group=PRODUCER_GROUP, topics=[TOPIC], send_timeout=30) as producer:

        async def sender() -> None:
            while (index := await next_ticket(tickets)) is not None:
                # A refused send (a store stall) is resent, as a correct producer does.
                sends.refused += await send_until_stored(
                    producer, Message(TOPIC, MESSAGE_TYPE, sends.body(index))
                )
                sends.confirm()

        sends.start()
        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(release, sends, tickets_in)
                for _ in range(window):
                    nursery.start_soon(sender)
    return sends.report()


class Recorder(MessageListener):
    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.done = trio.Event()

    async def on_message(self, message: Message) -> bool:
        assert isinstance(message.body, bytes)
        if self.tally.record(message.body):
            self.done.set()
        return True


async def consume(target: str, tally: Tally, window: int, timeout: float) -> dict[str, object]:
    recorder = Recorder(tally)
    binding = Binding.direct(TOPIC, MESSAGE_TYPE, watermark=window)
    with trio.move_on_after(timeout):
        async with Consumer(
            target, group=CONSUMER_GROUP, bindings=[binding], listener=recorder, max_concurrency=window
        ):
            print("ready", flush=True)
            await recorder.done.wait()
    return tally.report()


def main() -> int:
    args = arguments(__doc__ or "")
    configure_logging("warning")
    tune_gc()  # as kiteq-server tunes its own process
    if args.role == "produce":
        report = trio.run(
            produce, args.target, Sends(args.count, args.rate, args.first), args.window, args.timeout
        )
    else:
        report = trio.run(consume, args.target, Tally(args.count), args.window, args.timeout)
    return emit(report)


if __name__ == "__main__":
    raise SystemExit(main())
