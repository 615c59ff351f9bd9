"""Delayed messages (property `kiteq.deliverAt`): lateness, the broker's cost, and what they cost others.

`kiteq-server` on the file store (`fsync=batch`), the producers and the consumers each in a
process of their own (benchmarks/clients/); every consumer group is bound, and its
consumer online, before the first message falls due. Lateness is the consumer's receipt
(wall clock) minus the `kiteq.deliverAt` the received message carries: never negative
unless the broker delivered early, which each phase counts. Phases, each on a fresh broker:

1. scheduled: N messages, each due at a moment drawn uniformly from a window of `spread`
   seconds, sent in that random order with WINDOW sends in flight. A first short run
   (messages due in an hour, of a type no group takes) measures this machine's rate of
   scheduled sends; the window then opens SEND_MARGIN expected send times ahead, so all N
   are stored and held before the first falls due (the params count any that were not),
   and lasts max(the minimum, expected send time + tail) seconds, so messages fall due
   more slowly than they were sent. Figures: the send rate, lateness p50/p99/max, early
   deliveries, the broker's peak RSS and its RSS after the sends minus before, per message;
2. burst: M messages all due at the same moment (after the last send): lateness and the
   rate the consumer drained them at, from that moment, which bounds the lateness;
3. ordinary traffic: a paced end-to-end stream (benchmarks/clients/kiteq_client.py),
   latency p50/p99 alone; beside DELAYED_RATE undelayed messages per second (the same
   messages with a kiteq.deliverAt in the past: the same bytes, delivered at once); and
   beside DELAYED_RATE delayed ones per second, each due `delay` s after its send. The
   delayed / undelayed ratio is what scheduling costs others; delayed / alone includes the
   extra messages' own cost (and their clients', on the same cores).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from benchmarks.clients.workload import CONSUMER_GROUP, MESSAGE_TYPE, TOPIC
from benchmarks.harness import ROOT, Figure, Report, client_report
from benchmarks.versus_rabbitmq import Usage
from kiteq import Binding
from kiteq.registry import open_registry
from tests.procs.broker import BrokerProcess
from tests.procs.memory import memory_of
from tests.services.ports import stop_process

SUITE = "delayed"
DELAYED = "benchmarks.clients.delayed_client"
ORDINARY = "benchmarks.clients.kiteq_client"
DELAYED_GROUP = "bench-delayed"  # phase 3: its message type too
PROMPT_GROUP = "bench-prompt"  # phase 3's undelayed extra stream, and its message type
# The undelayed stream's messages carry a kiteq.deliverAt this far in the past: the same
# bytes and parsing as the delayed ones, delivered at once.
PAST = -1.0
WINDOW = 256  # sends in flight, watermark, listeners at once
DELAYED_RATE = 1_000.0
SEND_MARGIN = 1.25  # phase 1's first message falls due this many expected send times ahead
CLIENT_TIMEOUT = 900.0
STOP_TIMEOUT = 30.0
MiB = 2**20


@dataclass(frozen=True)
class Sizes:
    """Messages and seconds of each phase."""

    scheduled: int
    min_spread: float  # seconds phase 1's due times spread over, at least
    tail: float  # seconds after the expected end of phase 1's sends until the last falls due
    lead: float  # seconds from a scheduling producer's launch until its first message falls due
    calibrate: int
    burst: int
    ordinary_rate: float
    ordinary_seconds: float
    delay: float

    @classmethod
    def of(cls, quick: bool, messages: int | None) -> Sizes:
        if quick:
            return cls(messages or 20_000, 10.0, 5.0, 3.0, 2_000, 5_000, 500.0, 4.0, 2.0)
        return cls(messages or 1_000_000, 60.0, 30.0, 5.0, 20_000, 100_000, 2_000.0, 20.0, 5.0)


def _report(client: subprocess.Popen[str]) -> Report:
    return client_report(client, CLIENT_TIMEOUT + 60)


def _ready(consumer: subprocess.Popen[str]) -> subprocess.Popen[str]:
    """A consumer process, once it says it is consuming."""
    assert consumer.stdout is not None
    if consumer.stdout.readline().strip() != "ready":
        _report(consumer)  # raises: it exited before it was ready
    return consumer


class Fleet:
    """A fresh kiteq-server on the file store, routing by the (group, message type) bindings,
    and the client processes started against it: on leaving, clients still running (a
    phase that failed) are killed by pid, then the broker is stopped."""

    def __init__(self, *bindings: tuple[str, str]) -> None:
        self.bindings = bindings
        self.workdir = Path(tempfile.mkdtemp(prefix="kiteq-delayed-"))
        self.broker = BrokerProcess(
            self.workdir, f"file://{self.workdir}/registry.json?poll=0.1", extra=("--log-level", "warning")
        )
        self.clients: list[subprocess.Popen[str]] = []

    def __enter__(self) -> Fleet:
        trio.run(self._bind)
        return self

    async def _bind(self) -> None:
        await self.broker.start()
        async with open_registry(self.broker.registry) as registry:
            for group, message_type in self.bindings:
                binding = Binding.direct(TOPIC, message_type, group=group, watermark=WINDOW)
                await registry.put_bindings(group, TOPIC, [binding])
        await self.broker.wait_bindings(len(self.bindings))

    def __exit__(self, *exc_info: object) -> None:
        for client in self.clients:
            if client.poll() is None:
                client.kill()
                client.wait()
        if self.broker.process is not None:
            stop_process(self.broker.process, timeout=STOP_TIMEOUT)
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def pid(self) -> int:
        assert self.broker.process is not None
        return self.broker.process.pid

    def client(self, module: str, role: str, count: int, *options: object) -> subprocess.Popen[str]:
        options = (
            *("--target", self.broker.registry, "--count", count, *options),
            *("--window", WINDOW, "--timeout", CLIENT_TIMEOUT),
        )
        command = [sys.executable, "-m", module, role, *map(str, options)]
        client = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        self.clients.append(client)
        return client

    def scheduled(self) -> int:
        """Delayed messages the broker holds, not yet delivered (`/stats`)."""
        total: int = trio.run(self.broker.stats)["scheduled"]["total"]
        return total


def _lateness(phase: str, got: Report, params: Mapping[str, object]) -> list[Figure]:
    params = {**params, "duplicates": got["duplicates"]}
    return [
        *(
            Figure(SUITE, f"{phase}: lateness {key[:-3]}", got[key], "ms", params)
            for key in ("p50_ms", "p99_ms", "max_ms")
        ),
        Figure(SUITE, f"{phase}: delivered early", got["early"], "messages", params),
    ]


def _phase_scheduled(sizes: Sizes) -> tuple[list[Figure], float]:
    """Phase 1's figures, and the rate scheduled sends were stored at."""
    count = sizes.scheduled
    with Fleet((DELAYED_GROUP, "scheduled")) as fleet:
        consumer = _ready(fleet.client(DELAYED, "consume", count, "--type", "scheduled"))
        # No group takes this type: these only measure the rate, and stay scheduled an hour.
        probe_due = time.time() + 3600
        probe = _report(
            fleet.client(DELAYED, "schedule", sizes.calibrate, "--type", "probe", "--start", probe_due)
        )
        expected = count / probe["rate"]  # seconds the sends should take
        spread = max(sizes.min_spread, expected + sizes.tail)
        lead = sizes.lead + SEND_MARGIN * expected
        held_before, rss_before = fleet.scheduled(), memory_of(fleet.pid)[0]
        with Usage(fleet.pid) as usage:
            start = time.time() + lead
            options = ("--type", "scheduled", "--start", start, "--spread", spread)
            sent = _report(fleet.client(DELAYED, "schedule", count, *options))
            rss_after, held = memory_of(fleet.pid)[0], fleet.scheduled() - held_before
            got = _report(consumer)
    params: dict[str, object] = {
        "messages": count,
        "spread_s": round(spread, 1),
        "first_due_after_s": round(lead, 1),
        "min_spread_s": sizes.min_spread,
        "probe_rate": round(probe["rate"]),
        "window": WINDOW,
        "stored_after_due": sent["stored_late"],
        "refused": sent["refused"],
        "held_after_sends": held,
        "broker_cpu_s": round(usage.cpu, 1),
        "machine_busy_cores": round(usage.machine_busy, 2),
    }
    per_message = (rss_after - rss_before) / count
    return [
        Figure(SUITE, "scheduled: send rate", sent["rate"], "msgs/s", params),
        *_lateness("scheduled", got, params),
        Figure(SUITE, "scheduled: broker peak RSS", usage.peak_rss / MiB, "MiB", params),
        Figure(
            SUITE,
            "scheduled: broker RSS per scheduled message",
            per_message,
            "bytes",
            {
                **params,
                "rss_before_mib": round(rss_before / MiB, 1),
                "rss_after_mib": round(rss_after / MiB, 1),
            },
        ),
    ], sent["rate"]


def _phase_burst(sizes: Sizes, send_rate: float) -> list[Figure]:
    count = sizes.burst
    with Fleet((DELAYED_GROUP, "burst")) as fleet:
        consumer = _ready(fleet.client(DELAYED, "consume", count, "--type", "burst"))
        # Due once every send is stored, were they a third slower than phase 1's.
        due = time.time() + sizes.lead + 1.5 * count / send_rate
        sent = _report(fleet.client(DELAYED, "schedule", count, "--type", "burst", "--start", due))
        got = _report(consumer)
    drained = got["received"] / max(1e-3, got["last_received"] - due)
    params: dict[str, object] = {
        "messages": count,
        "stored_after_due": sent["stored_late"],
        "refused": sent["refused"],
    }
    return [
        *_lateness("burst", got, params),
        Figure(SUITE, "burst: drain rate from the due time", drained, "msgs/s", params),
    ]


def _ordinary(fleet: Fleet, count: int, rate: float, first: int) -> Report:
    """The consumer's report of a paced ordinary stream (latency from each send's scheduled time)."""
    consumer = _ready(fleet.client(ORDINARY, "consume", count))
    _report(fleet.client(ORDINARY, "produce", count, "--rate", rate, "--first", first))
    return _report(consumer)


def _beside(fleet: Fleet, sizes: Sizes, count: int, group: str, delay: float) -> tuple[Report, Report]:
    """The ordinary stream's report while DELAYED_RATE messages per second, each due `delay`
    seconds after its send, are sent and delivered to `group`; and that stream's consumer's.

    The extra stream starts `delay + 1` s before the ordinary one (its deliveries are under
    way) and goes on 2 s after it.
    """
    extra = round(DELAYED_RATE * (max(0.0, delay) + 1 + sizes.ordinary_seconds + 2))
    consumer = _ready(fleet.client(DELAYED, "consume", extra, "--group", group, "--type", group))
    options = ("--type", group, "--rate", DELAYED_RATE, "--delay", delay)
    producer = fleet.client(DELAYED, "schedule", extra, *options)
    time.sleep(max(0.0, delay) + 1)
    ordinary = _ordinary(fleet, count, sizes.ordinary_rate, count)
    sent, got = _report(producer), _report(consumer)
    return ordinary, {**got, "stored_late": sent["stored_late"], "messages": extra}


def _phase_ordinary(sizes: Sizes) -> list[Figure]:
    count = round(sizes.ordinary_rate * sizes.ordinary_seconds)
    bindings = ((CONSUMER_GROUP, MESSAGE_TYPE), (PROMPT_GROUP, PROMPT_GROUP), (DELAYED_GROUP, DELAYED_GROUP))
    with Fleet(*bindings) as fleet:
        alone = _ordinary(fleet, count, sizes.ordinary_rate, 0)
        prompt, _ = _beside(fleet, sizes, count, PROMPT_GROUP, PAST)
        delayed, steady = _beside(fleet, sizes, count, DELAYED_GROUP, sizes.delay)
    params: dict[str, object] = {
        "offered_rate": sizes.ordinary_rate,
        "messages": count,
        "seconds": sizes.ordinary_seconds,
    }
    beside = {**params, "extra_rate": DELAYED_RATE}
    figures = []
    for key in ("p50_ms", "p99_ms"):
        name = f"ordinary latency {key[:-3]}"
        figures += [
            Figure(SUITE, f"{name} alone", alone[key], "ms", params),
            Figure(SUITE, f"{name} beside undelayed", prompt[key], "ms", beside),
            Figure(SUITE, f"{name} beside delayed", delayed[key], "ms", {**beside, "delay_s": sizes.delay}),
            Figure(SUITE, f"{name} delayed / alone", delayed[key] / max(alone[key], 1e-9), "ratio", beside),
            Figure(
                SUITE, f"{name} delayed / undelayed", delayed[key] / max(prompt[key], 1e-9), "ratio", beside
            ),
        ]
    steady_params = {
        "messages": steady["messages"],
        "rate": DELAYED_RATE,
        "delay_s": sizes.delay,
        "stored_after_due": steady["stored_late"],
    }
    return figures + _lateness("steady delayed stream", steady, steady_params)


def run(quick: bool, messages: int | None = None) -> list[Figure]:
    """`messages` scheduled in phase 1: 1,000,000 by default, 20,000 with `quick` (due over 10 s)."""
    sizes = Sizes.of(quick, messages)
    scheduled, send_rate = _phase_scheduled(sizes)
    return scheduled + _phase_burst(sizes, send_rate) + _phase_ordinary(sizes)
