"""KiteQ-py side of versus_rabbitmq: the project's Producer or Consumer in a process of its own.

`produce`: one task sends through a `Producer.pipeline` of `--window` sends in flight,
each once it is due (paced, woken by an `Alarm`) and the window has room, as the pika
publisher does; like pika's, each body is built once there is room.
`consume`: one Consumer of the group whose persistent binding (watermark = `--window`)
the benchmark registered; listeners run up to `--window` at once. Prints `ready` once
connected (consume), then a JSON report.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from benchmarks.clients.pacing import Alarm
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
from kiteq import Binding, Consumer, Message, MessageListener, Producer, SendError
from kiteq.gc_tuning import tune_gc
from kiteq.logging import configure_logging

RESEND_PAUSE = 0.1  # seconds before resending what the broker refused after the last send


async def send_paced(
    producer: Producer,
    sends: Sends,
    window: int,
    message_of: Callable[[int], Message],
    on_stored: Callable[[Message], None] = lambda message: None,
) -> None:
    """Send `message_of(index)` for each of `sends`, each once it is due and the window has
    room; resend what the broker refuses (a store stall) until it is stored, as a correct
    producer does (the same id is stored once). `on_stored` sees each message stored."""
    refused: list[Message] = []

    def stored(message: Message, error: SendError | None) -> None:
        if error is None:
            assert isinstance(message.body, bytes)
            sends.confirm([sends.index_of(message.body)])
            on_stored(message)
        else:
            sends.refused += 1
            refused.append(message)

    alarm = Alarm()
    try:
        async with producer.pipeline(stored, window=window) as pipeline:
            for index in range(sends.count):
                while refused:
                    await pipeline.send(refused.pop())
                if sends.delay(index) > 0:
                    alarm.set(sends.due_at(index))
                    await trio.lowlevel.wait_readable(alarm.fd)
                    alarm.clear()
                await pipeline.wait_for_room()  # an unpaced body is stamped as it leaves, as pika's are
                await pipeline.send(message_of(index))
                sends.left(index)
    finally:
        alarm.close()
    while refused:  # refused among the last sends
        await trio.sleep(RESEND_PAUSE)
        async with producer.pipeline(stored, window=window) as pipeline:
            while refused:
                await pipeline.send(refused.pop())


async def produce(target: str, sends: Sends, window: int, timeout: float) -> dict[str, object]:
    async with Producer(target, group=PRODUCER_GROUP, topics=[TOPIC], send_timeout=30) as producer:
        sends.start()
        with trio.move_on_after(timeout):
            await send_paced(
                producer, sends, window, lambda index: Message(TOPIC, MESSAGE_TYPE, sends.body(index))
            )
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
