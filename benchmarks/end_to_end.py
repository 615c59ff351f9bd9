"""End to end: kiteq-server in its own process, 1 producer -> 1 group of 2 consumers.

Bodies are 1 KiB and carry their send time, so the consumer measures send->listener
latency. Throughput: `window` sender tasks share one producer, each sending its next
message as soon as the previous one is stored, so `window` sends are in flight; the figure is
messages acked by the group per second, the median of 3 runs. Latency at half load:
sends paced at half that median, 3 runs; each percentile is the median of the runs'.

Variants: the memory and file stores; the file store with the broker's delivery log
on, with TLS on the client port (trustme certificates made for the run), and with
another group reading the same messages slowly through a 16 KiB receive buffer
(`file-batch+slow-reader`), and with 2,000 more connections open and idle, held by
another process (`file-batch+idle-connections`) — each one's cost is its difference to
`file-batch`, the last two's are what a slow reader and a crowd of idle clients cost the
fleet; the MySQL store on a local MariaDB master + replica started for the run (when
mariadbd is installed).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import structlog
import trio

from benchmarks.harness import ROOT, Figure, percentile
from kiteq import Binding, Consumer, Message, MessageListener, Producer
from kiteq.gc_tuning import tune_gc
from kiteq.logging import configure_logging
from kiteq.registry import open_registry
from tests.certificates import make_certificates
from tests.faults.resend import send_until_stored
from tests.procs.broker import server_command
from tests.procs.slow_reader import SlowReader
from tests.services.ports import free_port, stop_process, wait_for_port


@dataclass(frozen=True)
class Variant:
    """How the broker runs: its store, more flags (`{dir}` is the run's directory), TLS or not."""

    store: str
    flags: tuple[str, ...] = ()
    tls: bool = False
    # Another group reads the same messages slowly through a 16 KiB receive buffer
    # (tests/procs/slow_reader.py): the fleet's rate beside `file-batch` is what it costs them.
    slow_reader: bool = False
    # Connections that authenticate, then only answer heartbeats, open through the run
    # (benchmarks/clients/idle_connections.py).
    idle_connections: int = 0


FILE_STORE = "file://{dir}/store?fsync=batch"
VARIANTS: dict[str, Variant] = {
    "memory": Variant("memory://"),
    "file-batch": Variant(FILE_STORE),
    "file-batch+delivery-log": Variant(FILE_STORE, ("--delivery-log", "{dir}/delivery.log")),
    "file-batch+tls": Variant(FILE_STORE, tls=True),
    "file-batch+slow-reader": Variant(FILE_STORE, slow_reader=True),
    "file-batch+idle-connections": Variant(FILE_STORE, idle_connections=2000),
    "mysql": Variant("{mysql}"),
}
WINDOW = 256
log = structlog.get_logger(__name__)


class Clock(MessageListener):
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.seen: set[str] = set()
        self.done = trio.Event()
        self.expected = 0

    async def on_message(self, message: Message) -> bool:
        sent = struct.unpack_from(">d", message.body)[0]  # type: ignore[arg-type]
        self.latencies.append((time.time() - sent) * 1000)
        self.seen.add(message.message_id)
        if len(self.seen) >= self.expected:
            self.done.set()
        return True


def body() -> bytes:
    return struct.pack(">d", time.time()) + b"x" * 1016


async def _drive(
    registry: str, address: str, variant: Variant, count: int, rate: float | None, ca: str | None
) -> tuple[float, list[float]]:
    clock = Clock()
    clock.expected = count
    binding = [Binding.direct("bench", "e2e", watermark=2000)]
    if variant.slow_reader:
        async with open_registry(registry) as bindings:
            await bindings.put_bindings("slow", "bench", binding)
    async with (
        trio.open_nursery() as others,
        Consumer(registry, group="sink", bindings=binding, listener=clock, max_concurrency=512, tls=ca),
        Consumer(registry, group="sink", bindings=binding, listener=clock, max_concurrency=512, tls=ca),
        Producer(registry, group="source", topics=["bench"], send_timeout=30, tls=ca) as producer,
    ):
        if variant.slow_reader:
            others.start_soon(SlowReader(count).run, address, "slow")
        await trio.sleep(1.0)
        started = time.perf_counter()
        tickets = iter(range(count))
        permits = trio.Semaphore(0)
        refused = 0

        async def sender() -> None:
            nonlocal refused
            for _ in tickets:
                if rate is not None:
                    await permits.acquire()
                # As a correct producer does: a refused send (a store stall) is resent, and
                # its latency, measured from the first send, includes the wait.
                refused += await send_until_stored(producer, Message("bench", "e2e", body()))

        async with trio.open_nursery() as nursery:
            if rate is not None:
                nursery.start_soon(_pace, permits, count, rate)
            for _ in range(WINDOW):
                nursery.start_soon(sender)
        with trio.fail_after(120):
            await clock.done.wait()
        elapsed = time.perf_counter() - started
        others.cancel_scope.cancel()
    if refused:
        log.warning("bench.sends_refused", count=refused, detail="resent until stored; counted in latency")
    return count / elapsed, clock.latencies


async def _pace(permits: trio.Semaphore, count: int, rate: float) -> None:
    """Release the i-th send at i / rate seconds. One wake-up releases every send due by
    then: a sleep per send would cost the clients' process about as much as the send."""
    started = trio.current_time()
    for i in range(count):
        due = started + i / rate
        if due > trio.current_time():
            await trio.sleep_until(due)
        permits.release()


def _measure(variant: Variant, count: int, rate: float | None) -> tuple[float, list[float]]:
    workdir = Path(tempfile.mkdtemp(prefix="kiteq-bench-"))
    registry = f"file://{workdir}/registry.json?poll=0.1"
    port = free_port()
    flags = [arg.format(dir=workdir) for arg in variant.flags]
    ca = None
    if variant.tls:
        certificates = make_certificates(workdir)
        ca = str(certificates.ca_pem)
        flags += ["--tls-cert", str(certificates.cert), "--tls-key", str(certificates.key)]
    command = server_command(
        f"127.0.0.1:{port}", variant.store.format(dir=workdir), registry, "--log-level", "warning", *flags
    )
    proc = subprocess.Popen(command, cwd=workdir, env={**os.environ})
    try:
        wait_for_port(port)
        address = f"127.0.0.1:{port}"
        with _idle_connections(address, variant.idle_connections):
            return trio.run(_drive, registry, address, variant, count, rate, ca)
    finally:
        stop_process(proc)


@contextlib.contextmanager
def _idle_connections(address: str, count: int) -> Iterator[None]:
    """`count` idle connections to `address`, held by a process of their own while in the block."""
    if not count:
        yield
        return
    command = [sys.executable, "-m", "benchmarks.clients.idle_connections", address, str(count)]
    holder = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the idle connections' process ended first (exit {holder.wait()})")
        yield
    finally:
        stop_process(holder)


def run(quick: bool) -> list[Figure]:
    configure_logging("warning")
    tune_gc()  # the clients' process, tuned as the broker tunes its own
    # Room for the idle connections at both ends: the broker inherits the limit.
    _, most = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (most, most))
    count = 5_000 if quick else 50_000
    figures = []
    for name, variant in VARIANTS.items():
        if "{mysql}" not in variant.store:
            figures += _variant(name, variant, count, quick)
        elif shutil.which("mariadbd"):
            # Started for its own variant only: the other variants run without it on the cores.
            with _mysql_database() as mysql:
                figures += _variant(name, replace(variant, store=mysql), count, quick)
    return figures


@contextlib.contextmanager
def _mysql_database() -> Iterator[str]:
    """A fresh database on a local MariaDB master + replica, for the run."""
    from stores.mysql import init_schema
    from tests.services.mariadb import start_pair

    pair = start_pair()
    try:
        uri = pair.uri(pair.new_database())
        trio.run(init_schema, uri)
        yield uri
    finally:
        pair.close()


def _variant(name: str, variant: Variant, count: int, quick: bool) -> list[Figure]:
    repeats = 1 if quick else 3
    throughputs, latencies = [], []
    for _ in range(repeats):
        rate, lat = _measure(variant, count, None)
        throughputs.append(rate)
        latencies.append(lat)
    best = sorted(throughputs)[len(throughputs) // 2]
    params = {"store": name, "messages": count, "body": 1024, "window": WINDOW, "consumers": 2}
    all_lat = [x for run_lat in latencies for x in run_lat]
    figures = [
        Figure("end_to_end", f"throughput ({name})", best, "msgs/s", params, throughputs),
        Figure("end_to_end", f"latency p50 at full load ({name})", percentile(all_lat, 50), "ms", params),
        Figure("end_to_end", f"latency p99 at full load ({name})", percentile(all_lat, 99), "ms", params),
    ]
    half = best / 2
    half_runs = [_measure(variant, min(count, int(half * 10)), half)[1] for _ in range(repeats)]
    half_params = {**params, "offered_rate": round(half)}
    for quantile in (50, 99):
        per_run = [percentile(run_lat, quantile) for run_lat in half_runs]
        figures.append(
            Figure(
                "end_to_end",
                f"latency p{quantile} at half load ({name})",
                statistics.median(per_run),
                "ms",
                half_params,
                per_run,
            )
        )
    return figures
