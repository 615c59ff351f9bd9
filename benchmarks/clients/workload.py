"""The workload both sides' clients run, so KiteQ-py and RabbitMQ see the same messages and clock.

A body is 1 KiB: its send time (wall clock, so the consumer process can read it) and a
sequence number (so redeliveries are counted once), then padding. A producer keeps
`window` sends in flight, optionally released on a fixed schedule; a consumer counts
distinct sequence numbers until it has them all. Each reports JSON on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import struct
import time
from collections.abc import Callable

from benchmarks.harness import percentile

BODY = 1024
HEADER = struct.Struct(">dQ")  # send time (s since the epoch), sequence number
PADDING = b"x" * (BODY - HEADER.size)
# The names both sides use: a KiteQ topic + message type, a RabbitMQ queue.
TOPIC = "bench"
MESSAGE_TYPE = "versus"
QUEUE = "bench.versus"
PRODUCER_GROUP = "bench-source"
CONSUMER_GROUP = "bench-sink"


def arguments(description: str) -> argparse.Namespace:
    """The command line both clients share: `produce` or `consume`, at `--target`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("--target", required=True, help="the broker: a registry URI or an AMQP URL")
    parser.add_argument("--count", type=int, required=True, help="messages to send or to receive")
    parser.add_argument("--window", type=int, default=100, help="sends in flight; prefetch / watermark")
    parser.add_argument("--rate", type=float, help="release sends at this many per second")
    parser.add_argument("--first", type=int, default=0, help="the first sequence number sent")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    return parser.parse_args()


def emit(report: dict[str, object]) -> int:
    """Print the report for the benchmark process; the exit status says whether it is complete."""
    report["cpu_seconds"] = time.process_time()
    print(json.dumps(report), flush=True)
    return 0 if report["complete"] else 1


class Sends:
    """A producer's schedule and its confirmations.

    Paced sends carry their scheduled time, not the time they left: a producer that
    falls behind the schedule shows as latency instead of hiding it.
    """

    def __init__(
        self, count: int, rate: float | None, first: int, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.clock = clock  # the pacing alarm (a timerfd) is armed on time.perf_counter's clock
        self.count = count
        self.rate = rate
        self.first = first
        self.refused = 0  # sends the broker refused and the producer resent
        self.confirmed: list[float] = []
        self.lateness: list[float] = []  # paced: how long after its due time each send left
        self.handed = [0.0] * count  # when each send was first handed to the client library
        self.acked_after: list[float] = []  # seconds from each hand-off to its store-ack / confirm
        self.start()

    def start(self) -> None:
        """The clock starts once connected: connecting is not part of the rate."""
        self.started = self.clock()
        self.wall_started = time.time()

    def due_at(self, index: int) -> float:
        """When send `index` is due, on time.perf_counter's clock (the start when unpaced)."""
        if self.rate is None:
            return self.started
        return self.started + index / self.rate

    def delay(self, index: int) -> float:
        """Seconds until send `index` is due (never positive when unpaced)."""
        return self.due_at(index) - self.clock()

    def body(self, index: int) -> bytes:
        sent = time.time() if self.rate is None else self.wall_started + index / self.rate
        return HEADER.pack(sent, self.first + index) + PADDING

    def left(self, index: int) -> None:
        """Send `index` was handed to the client library just now, for the first time (a
        resend is not reported). Paced, how late that was is kept too (an unpaced send is
        due at once, whenever it leaves)."""
        now = self.clock()
        self.handed[index] = now
        if self.rate is not None:
            self.lateness.append(now - self.due_at(index))

    def confirm(self, indexes: list[int]) -> None:
        """The broker confirmed sends `indexes` (store-acks, or one publisher confirm for
        several) just now."""
        now = self.clock()
        self.confirmed.extend([now] * len(indexes))
        self.acked_after.extend(now - self.handed[index] for index in indexes)

    def index_of(self, body: bytes) -> int:
        """The index of the send whose body this is (`body(index)`)."""
        return int(HEADER.unpack_from(body)[1]) - self.first

    @property
    def done(self) -> bool:
        return len(self.confirmed) >= self.count

    def report(self) -> dict[str, object]:
        """Confirmed sends per second, over the whole run and over each tenth of it; how
        long a send waited for its store-ack or confirm after the producer handed it to
        its client library (p50 and p99, ms: while that exceeds window / rate, a paced
        producer's window is full and its sends wait); paced, also how late the sends left
        (p50 and p99, ms): latency counts from the schedule, so this says how much of it
        is the producer's own."""
        done = self.confirmed
        tenths = self.tenth_rates()
        report: dict[str, object] = {
            "complete": self.done,
            "confirmed": len(done),
            "refused": self.refused,
            "rate": _rate(len(done), done[-1] - self.started if done else 0.0),
            "first_tenth_rate": tenths[0],
            "last_tenth_rate": tenths[-1],
            "tenth_rates": tenths,
        }
        if self.acked_after:
            report |= _p50_p99_ms("ack", self.acked_after)
        if self.lateness:
            report |= _p50_p99_ms("late", self.lateness)
        return report

    def tenth_rates(self) -> list[float]:
        """The rate over each tenth of the confirmations, in order: whether a rate that
        falls does so steadily or in a dip shows here. Tenth k holds confirmations
        k*n//10 up to (k+1)*n//10 and runs from the end of the one before (the first from
        the start); an empty one (fewer than ten confirmations) has rate 0."""
        done = self.confirmed
        edges = [k * len(done) // 10 for k in range(11)]
        rates = []
        previous = self.started
        for first, after in itertools.pairwise(edges):
            if after == first:
                rates.append(0.0)
                continue
            rates.append(_rate(after - first, done[after - 1] - previous))
            previous = done[after - 1]
        return rates


class Tally:
    """What a consumer received: distinct messages, duplicates, and each one's latency."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.seen: set[int] = set()
        self.duplicates = 0
        self.latencies: list[float] = []
        self.first_sent = math.inf
        self.last_received = 0.0
        self.started = time.time()

    def record(self, body: bytes) -> bool:
        """Count one delivery; True once every expected message has arrived."""
        now = time.time()
        sent, sequence = HEADER.unpack_from(body)
        if sequence in self.seen:
            self.duplicates += 1
        else:
            self.seen.add(sequence)
            self.latencies.append((now - sent) * 1000)
            self.first_sent = min(self.first_sent, sent)
            self.last_received = now
        return len(self.seen) >= self.expected

    def report(self) -> dict[str, object]:
        """`rate` counts from this consumer's start (a drain); `end_to_end_rate` from the first send."""
        received = len(self.seen)
        return {
            "complete": received >= self.expected,
            "received": received,
            "duplicates": self.duplicates,
            "rate": _rate(received, self.last_received - self.started),
            "end_to_end_rate": _rate(received, self.last_received - self.first_sent),
            "p50_ms": percentile(self.latencies, 50),
            "p99_ms": percentile(self.latencies, 99),
            "max_ms": max(self.latencies, default=0.0),
        }


def _p50_p99_ms(name: str, seconds: list[float]) -> dict[str, object]:
    """`{name}_p50_ms` and `{name}_p99_ms` of durations given in seconds."""
    millis = [value * 1000 for value in seconds]
    return {f"{name}_p50_ms": percentile(millis, 50), f"{name}_p99_ms": percentile(millis, 99)}


def _rate(messages: int, seconds: float) -> float:
    return messages / seconds if seconds > 0 else 0.0
