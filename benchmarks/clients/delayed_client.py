"""Delayed messages for benchmarks/delayed.py: a scheduling Producer or a Consumer, in a process of its own.

`schedule`: one Producer keeps `--window` sends in flight (`send_paced`). Each message asks to be delivered
at a moment drawn uniformly from [`--start`, `--start` + `--spread`], or `--delay` seconds
after its send; with `--rate`, sends are released on a fixed schedule. It reports how many
were stored only after their time (their lateness includes the send's). `consume`: one Consumer whose
listener takes each message's lateness, receipt minus the `kiteq.deliverAt` it carries.
Prints `ready` once connected (consume), then a JSON report.
"""

from __future__ import annotations

import argparse
import math
import random
import time

import trio

from benchmarks.clients.kiteq_client import send_paced
from benchmarks.clients.workload import PRODUCER_GROUP, TOPIC, Sends, emit
from benchmarks.harness import percentile
from kiteq import Binding, Consumer, Message, MessageListener, Producer
from kiteq.gc_tuning import tune_gc
from kiteq.logging import configure_logging


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=["schedule", "consume"])
    parser.add_argument("--target", required=True, help="the registry URI")
    parser.add_argument("--count", type=int, required=True, help="messages to send or to receive")
    parser.add_argument("--type", required=True, help="the message type (each phase binds its own)")
    parser.add_argument("--group", default="bench-delayed", help="the consumer group")
    parser.add_argument("--window", type=int, default=256, help="sends in flight; watermark")
    parser.add_argument("--rate", type=float, help="release sends at this many per second")
    parser.add_argument("--start", type=float, help="Unix time the first message falls due")
    parser.add_argument("--spread", type=float, default=0.0, help="seconds the due times spread over")
    parser.add_argument("--delay", type=float, help="due this many seconds after its send instead")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    return parser.parse_args()


class Schedule:
    """When each message falls due, and how many were stored only after that."""

    def __init__(self, args: argparse.Namespace) -> None:
        if (args.start is None) == (args.delay is None):
            raise SystemExit("give --start (with --spread) or --delay")
        self.start, self.spread, self.delay = args.start, args.spread, args.delay
        self.stored_late = 0

    def due(self) -> float:
        if self.delay is not None:
            return time.time() + self.delay
        return self.start + self.spread * random.random()


async def schedule(args: argparse.Namespace) -> dict[str, object]:
    sends, plan = Sends(args.count, args.rate, 0), Schedule(args)

    def message_of(index: int) -> Message:
        message = Message(TOPIC, args.type, sends.body(index))
        message.schedule(plan.due())
        return message

    def stored(message: Message) -> None:
        plan.stored_late += time.time() > message.deliver_at  # type: ignore[operator]

    async with Producer(args.target, group=PRODUCER_GROUP, topics=[TOPIC], send_timeout=30) as producer:
        sends.start()
        with trio.move_on_after(args.timeout):
            await send_paced(producer, sends, args.window, message_of, stored)
    return {**sends.report(), "stored_late": plan.stored_late}


class Lateness(MessageListener):
    """Each distinct message's lateness (ms; negative: delivered early) and when they came."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.lateness: dict[str, float] = {}
        self.duplicates = 0
        self.last_received = 0.0
        self.done = trio.Event()

    async def on_message(self, message: Message) -> bool:
        now = time.time()
        if message.message_id in self.lateness:
            self.duplicates += 1
            return True
        self.lateness[message.message_id] = (now - (message.deliver_at or math.nan)) * 1000
        self.last_received = now
        if len(self.lateness) >= self.expected:
            self.done.set()
        return True

    def report(self) -> dict[str, object]:
        late = list(self.lateness.values())
        return {
            "complete": len(late) >= self.expected,
            "received": len(late),
            "duplicates": self.duplicates,
            "early": sum(1 for ms in late if not ms >= 0),  # a missing deliverAt (nan) counts too
            "last_received": self.last_received,
            "p50_ms": percentile(late, 50),
            "p99_ms": percentile(late, 99),
            "max_ms": max(late, default=0.0),
        }


async def consume(args: argparse.Namespace) -> dict[str, object]:
    listener = Lateness(args.count)
    binding = Binding.direct(TOPIC, args.type, watermark=args.window)
    with trio.move_on_after(args.timeout):
        async with Consumer(
            args.target, group=args.group, bindings=[binding], listener=listener, max_concurrency=args.window
        ):
            print("ready", flush=True)
            await listener.done.wait()
    return listener.report()


def main() -> int:
    args = arguments()
    configure_logging("warning")
    tune_gc()  # as kiteq-server tunes its own process
    return emit(trio.run(schedule if args.role == "schedule" else consume, args))


if __name__ == "__main__":
    raise SystemExit(main())
