"""KiteQ-py against RabbitMQ: the same workload on each, producer and consumer in processes of their own.

RabbitMQ is Debian's `rabbitmq-server`, a throwaway node started for the run (state in a
temp dir, loopback only, no plugins), with a durable classic queue, publisher confirms,
manual acks and prefetch 100 through pika. KiteQ-py is `kiteq-server` on the file store
(`fsync=batch`) with a persistent binding of watermark 100, through kiteq.Producer and
kiteq.Consumer; a third side is the same on the memory store, which should be at least
as fast as the file store in every figure. Messages are 1 KiB and persistent. Phases,
in order, on each side:

1. sync send: one send in flight, each awaiting its store ack / confirm;
2. backlog send: 100 in flight while the bound group is offline (rate over the whole
   run and its first and last tenth, so a rate that falls as the backlog grows shows);
3. idle: no client connected, the backlog stored: broker CPU over a few seconds;
4. drain: one consumer takes the backlog of phases 1 and 2;
5. end to end, unthrottled: consumer online, 100 sends in flight; latency send -> listener;
6. end to end, paced: sends offered at a fixed rate (latency from each send's scheduled time).

Per phase, the broker's CPU seconds (/proc/PID/stat) and peak RSS (VmHWM, reset at the
phase's start through /proc/PID/clear_refs), and in its params the clients' CPU seconds
and the cores the whole machine kept busy (what else ran shows there). Each run starts
every side's broker; the sides take turns phase by phase, the machine settled before
each. Each figure is the median of 3 runs per side; every figure comes with its ratio
KiteQ-py / RabbitMQ, and the memory store's with its ratio to the file store's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import trio

from benchmarks.clients.workload import BODY, CONSUMER_GROUP, MESSAGE_TYPE, TOPIC
from benchmarks.harness import ROOT, Figure, Report, client_report
from kiteq import Binding
from kiteq.registry import open_registry
from tests.procs.broker import BrokerProcess
from tests.procs.memory import memory_of
from tests.services.ports import free_port, stop_process, wait_for_port

SUITE = "versus_rabbitmq"
WINDOW = 100  # sends in flight, prefetch, watermark
PACED_RATE = 5_000.0
RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")  # Debian's, without its `su` wrapper
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
STOP_TIMEOUT = 30.0
CLIENT_TIMEOUT = 300.0
REPEATS = 3
# Before each phase the machine is left to settle: at most SETTLE_BUSY cores busy over a
# SETTLE_WINDOW, waited for at most SETTLE_TIMEOUT seconds.
SETTLE_BUSY = 0.1
SETTLE_WINDOW = 0.5
SETTLE_TIMEOUT = 10.0
KITEQ = "KiteQ-py"
KITEQ_MEMORY = "KiteQ-py, memory store"
RABBITMQ = "RabbitMQ"


@dataclass(frozen=True)
class Counts:
    """Messages per phase, and seconds of the idle phase."""

    sync: int
    backlog: int
    end_to_end: int
    paced: int
    idle: float

    @classmethod
    def scaled(cls, messages: int, idle: float) -> Counts:
        """Sync sends wait for a disk flush each, so they get a tenth; paced ones last
        `messages / PACED_RATE` seconds."""
        return cls(messages // 10, messages, messages, messages, idle)


@dataclass(frozen=True)
class Side:
    """A running broker, the clients' module and address, and the pid whose use is sampled."""

    name: str
    client: str
    target: str
    pid: int


class Unavailable(Exception):
    """RabbitMQ cannot run on this machine: the suite says why and goes on without it."""


class Usage:
    """A broker's CPU seconds and peak RSS over a `with` block, from /proc; how many cores
    the whole machine kept busy meanwhile (the broker, both clients, anything else); and
    the broker's busiest thread (`busiest_thread`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cpu = 0.0
        self.peak_rss = 0
        self.machine_busy = 0.0
        self.busiest_thread = (0.0, 0.0)
        self._machine = (0, 0)
        self._threads: ThreadTimes = {}
        self._started = 0.0

    def _cpu(self) -> float:
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        utime, stime = stat.rpartition(")")[2].split()[11:13]
        return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> Usage:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.cpu = self._cpu()
        self._machine = _machine_ticks()
        self._threads = thread_times(self.pid)
        self._started = time.monotonic()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cpu = self._cpu() - self.cpu
        self.peak_rss = memory_of(self.pid)[1]
        self.machine_busy = _busy_cores(self._machine, _machine_ticks())
        seconds = time.monotonic() - self._started
        self.busiest_thread = busiest_thread(self._threads, thread_times(self.pid), seconds)


# Thread id -> (nanoseconds on a CPU, nanoseconds runnable but waiting for one) since it started.
ThreadTimes = dict[int, tuple[int, int]]


def thread_times(pid: int) -> ThreadTimes:
    """Each thread of `pid` from /proc/PID/task/TID/schedstat; {} where the kernel keeps none."""
    times: ThreadTimes = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            on_cpu, waiting, _ = (int(field) for field in (task / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue  # the thread ended, or no schedstat
        times[int(task.name)] = (on_cpu, waiting)
    return times


def busiest_thread(before: ThreadTimes, after: ThreadTimes, seconds: float) -> tuple[float, float]:
    """The share of `seconds` that the thread most on a CPU spent on one, and waiting for one.

    A broker whose busiest thread is on a CPU or waiting for one nearly all the time is
    bound by that thread, however idle the machine's other cores are.
    """
    busiest = (0.0, 0.0)
    for thread, (on_cpu, waiting) in after.items():
        on_cpu_before, waiting_before = before.get(thread, (0, 0))
        share = ((on_cpu - on_cpu_before) / 1e9 / seconds, (waiting - waiting_before) / 1e9 / seconds)
        busiest = max(busiest, share)
    return busiest


def _machine_ticks() -> tuple[int, int]:
    """(all, idle + iowait) clock ticks of every core since boot."""
    ticks = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


def _busy_cores(before: tuple[int, int], after: tuple[int, int]) -> float:
    """How many cores the machine kept busy between two `_machine_ticks()`."""
    (total, idle), (total_before, idle_before) = after, before
    busy = 1 - (idle - idle_before) / max(1, total - total_before)
    return busy * (os.cpu_count() or 1)


def _client(side: Side, role: str, count: int, *options: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", side.client, role, "--target", side.target, "--count", str(count)]
    return subprocess.Popen(
        [*command, "--window", str(WINDOW), "--timeout", str(CLIENT_TIMEOUT), *options],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def _report(client: subprocess.Popen[str]) -> Report:
    return client_report(client, CLIENT_TIMEOUT + 60)


def _subscribed(side: Side, count: int) -> subprocess.Popen[str]:
    """A consumer process, once it says it is consuming."""
    consumer = _client(side, "consume", count)
    assert consumer.stdout is not None
    if consumer.stdout.readline().strip() != "ready":
        _report(consumer)  # raises: it exited before it was ready
    return consumer


def _end_to_end(side: Side, count: int, *options: str) -> list[Report]:
    """The producer's and the consumer's reports of `count` messages sent while a consumer is online."""
    consumer = _subscribed(side, count)
    try:
        producer = _report(_client(side, "produce", count, *options))
    except BaseException:
        consumer.kill()  # it would wait out its timeout for messages that will not come
        consumer.wait()
        raise
    return [producer, _report(consumer)]


# What each phase reads from the report of its last client: figure suffix -> (key, unit).
SENT = {"": ("rate", "msgs/s")}
BACKLOG = SENT | {
    ", first tenth": ("first_tenth_rate", "msgs/s"),
    ", last tenth": ("last_tenth_rate", "msgs/s"),
}
DRAINED = SENT
LATENCY = {
    "": ("end_to_end_rate", "msgs/s"),
    " p50": ("p50_ms", "ms"),
    " p99": ("p99_ms", "ms"),
}
PACED = LATENCY | {" max": ("max_ms", "ms")}
# What a phase's figures carry in their params from its clients' reports: sends resent,
# deliveries received twice, how long sends waited for their store-acks / confirms, and how
# late paced sends left (the producer's part of latency).
REPORTED = ("refused", "duplicates", "ack_p50_ms", "ack_p99_ms", "late_p50_ms", "late_p99_ms")
IDLE = "idle with backlog"

# name -> (value, unit, the conditions it was measured under)
Figures = dict[str, tuple[float, str, dict[str, object]]]


def _phases(side: Side, counts: Counts, figures: Figures) -> list[Callable[[], None]]:
    """Every phase on one side, in the order they must run (each leaves the broker as the
    next expects); each records its figures, broker CPU seconds and peak RSS in `figures`."""

    def phase(
        name: str, run: Callable[[], list[Report]], read: dict[str, tuple[str, str]], **params: object
    ) -> Callable[[], None]:
        def measured() -> None:
            with Usage(side.pid) as usage:
                reports = run()
            recorded = params | {
                "body": BODY,
                "clients_cpu_seconds": [round(r["cpu_seconds"], 2) for r in reports],
                "machine_busy_cores": round(usage.machine_busy, 2),
                "broker_busiest_thread": {
                    "on_cpu": round(usage.busiest_thread[0], 2),
                    "waiting": round(usage.busiest_thread[1], 2),
                },
            }
            recorded |= {key: r[key] for r in reports for key in REPORTED if key in r}
            for suffix, (key, unit) in read.items():
                figures[name + suffix] = (reports[-1][key], unit, recorded)
            figures[f"{name}: broker CPU"] = (usage.cpu, "s", recorded)
            figures[f"{name}: broker peak RSS"] = (usage.peak_rss / 2**20, "MiB", recorded)

        return measured

    def produce(count: int, *options: str) -> list[Report]:
        return [_report(_client(side, "produce", count, *options))]

    def idle() -> list[Report]:
        time.sleep(counts.idle)
        return []

    def idle_phase() -> None:
        phase(IDLE, idle, {}, seconds=counts.idle, stored=backlog)()
        cpu, _, params = figures[f"{IDLE}: broker CPU"]
        figures[f"{IDLE}: broker CPU per second"] = (cpu / counts.idle, "cores", params)

    # Each phase numbers its messages on from the last: a late redelivery is never taken for a new one.
    backlog, end_to_end = counts.sync + counts.backlog, counts.sync + counts.backlog + counts.end_to_end
    return [
        phase(
            "sync send", lambda: produce(counts.sync, "--window", "1"), SENT, messages=counts.sync, window=1
        ),
        phase(
            "backlog send",
            lambda: produce(counts.backlog, "--first", str(counts.sync)),
            BACKLOG,
            messages=counts.backlog,
            window=WINDOW,
        ),
        idle_phase,
        phase(
            "drain", lambda: [_report(_subscribed(side, backlog))], DRAINED, messages=backlog, prefetch=WINDOW
        ),
        phase(
            "end to end",
            lambda: _end_to_end(side, counts.end_to_end, "--first", str(backlog)),
            LATENCY,
            messages=counts.end_to_end,
            window=WINDOW,
        ),
        phase(
            "paced end to end",
            lambda: _end_to_end(side, counts.paced, "--first", str(end_to_end), "--rate", str(PACED_RATE)),
            PACED,
            messages=counts.paced,
            offered_rate=PACED_RATE,
        ),
    ]


def _settle() -> None:
    """Wait (at most SETTLE_TIMEOUT) until the machine is all but idle for SETTLE_WINDOW:
    what one broker does after a phase (compaction, garbage collection) must not run into
    the next side's phase."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while time.monotonic() < deadline:
        before = _machine_ticks()
        time.sleep(SETTLE_WINDOW)
        if _busy_cores(before, _machine_ticks()) <= SETTLE_BUSY:
            return


async def _bound(broker: BrokerProcess) -> None:
    """Start kiteq-server and bind the consumer group before any client runs (RabbitMQ's
    clients declare their queue): the backlog phase needs the group bound but offline."""
    await broker.start()
    binding = Binding.direct(TOPIC, MESSAGE_TYPE, group=CONSUMER_GROUP, watermark=WINDOW)
    async with open_registry(broker.registry) as registry:
        await registry.put_bindings(CONSUMER_GROUP, TOPIC, [binding])
    await broker.wait_bindings(1)


@contextlib.contextmanager
def _kiteq(name: str = KITEQ, store: str | None = None) -> Iterator[Side]:
    """kiteq-server on `store` (None: the file store, `fsync=batch`), its group bound."""
    workdir = Path(tempfile.mkdtemp(prefix="kiteq-versus-"))
    broker = BrokerProcess(
        # The file registry polled at its default interval (ZooKeeper watches instead): the idle
        # phase measures the broker as configured by default.
        workdir,
        f"file://{workdir}/registry.json",
        store=store,
        extra=("--log-level", "warning"),
    )
    try:
        trio.run(_bound, broker)
        assert broker.process is not None
        yield Side(name, "benchmarks.clients.kiteq_client", broker.registry, broker.process.pid)
    finally:
        if broker.process is not None:
            stop_process(broker.process, timeout=STOP_TIMEOUT)
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def _kiteq_memory() -> Iterator[Side]:
    with _kiteq(KITEQ_MEMORY, "memory://") as side:
        yield side


def _rabbitmq_env(workdir: Path, port: int, epmd_port: int) -> dict[str, str]:
    """Every piece of the node's state under `workdir`; every port on loopback."""
    (workdir / "rabbitmq.conf").write_text("log.console = false\nlog.file.level = warning\n")
    (workdir / "enabled_plugins").write_text("[].\n")  # no management plugin, nor any other
    return {
        **os.environ,
        "HOME": str(workdir),  # where Erlang writes its cookie
        "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(workdir / "log"),
        "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
        "RABBITMQ_NODENAME": f"bench-{os.getpid()}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(free_port()),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "ERL_EPMD_PORT": str(epmd_port),
    }


def _answers_amqp(port: int) -> bool:
    """Whether the node answers the AMQP 0-9-1 header with a method frame (Connection.Start)."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(AMQP_HEADER)
        return sock.recv(1) == b"\x01"
    return False


def _erlang_vm(server: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 60.0) -> int:
    """The pid of the Erlang VM (the start script's child) once the node answers AMQP."""
    deadline = time.monotonic() + timeout
    while not _answers_amqp(port):
        if server.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise Unavailable(f"rabbitmq-server exited with status {server.returncode}: {' | '.join(tail)}")
        if time.monotonic() > deadline:
            raise Unavailable(f"RabbitMQ does not answer AMQP on 127.0.0.1:{port} after {timeout} s")
        time.sleep(0.2)
    children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    return next(int(pid) for pid in children if Path(f"/proc/{pid}/comm").read_text().strip() == "beam.smp")


@contextlib.contextmanager
def _rabbitmq() -> Iterator[Side]:
    """A throwaway RabbitMQ node with its own epmd; both stopped by pid, the state dir removed.

    The start script, sent SIGTERM, stops the VM cleanly and waits for it; after
    STOP_TIMEOUT both get SIGKILL.
    """
    if not RABBITMQ_SERVER.exists() or shutil.which("epmd") is None:
        raise Unavailable(f"{RABBITMQ_SERVER} is not installed (`make bench-services` installs it)")
    if importlib.util.find_spec("pika") is None:
        raise Unavailable("pika is not installed (`pip install -e '.[bench]'`)")
    workdir = Path(tempfile.mkdtemp(prefix="rabbitmq-versus-"))
    port, epmd_port = free_port(), free_port()
    env = _rabbitmq_env(workdir, port, epmd_port)
    with open(workdir / "epmd.log", "wb") as log:
        epmd = subprocess.Popen(["epmd", "-port", str(epmd_port)], env=env, stderr=log)
    server, vm = None, None
    try:
        wait_for_port(epmd_port)
        with open(workdir / "server.log", "wb") as log:
            server = subprocess.Popen(
                [str(RABBITMQ_SERVER)], cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        vm = _erlang_vm(server, port, workdir / "server.log")
        yield Side(
            RABBITMQ, "benchmarks.clients.rabbitmq_client", f"amqp://guest:guest@127.0.0.1:{port}/%2F", vm
        )
    finally:
        if server is not None:
            stop_process(server, timeout=STOP_TIMEOUT)
        if vm is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(vm, signal.SIGKILL)  # still there only if the script was killed
        stop_process(epmd)
        shutil.rmtree(workdir, ignore_errors=True)


def run(quick: bool, messages: int | None = None) -> list[Figure]:
    """`messages` per throughput phase: 50,000 by default, 2,000 with `quick` (one run, 2 s idle).

    Every run starts a fresh broker per side, and the sides take turns phase by phase
    (the order rotated from run to run), the machine settled before each: a phase's
    figures on one side are seconds, not minutes, apart from the other's, so a machine
    whose speed drifts treats them alike. A figure is its side's median run.
    """
    counts = Counts.scaled(messages or (2_000 if quick else 50_000), 2.0 if quick else 10.0)
    starts = [_kiteq, _rabbitmq, _kiteq_memory]
    runs: dict[str, list[Figures]] = {}
    for repeat in range(1 if quick else REPEATS):
        turn = repeat % len(starts)
        with contextlib.ExitStack() as brokers:
            measured: dict[str, Figures] = {}
            plans = []
            for start in starts[turn:] + starts[:turn]:
                try:
                    side = brokers.enter_context(start())
                except Unavailable as exc:
                    print(
                        f"{SUITE}: RabbitMQ cannot run here, KiteQ-py's figures stand alone: {exc}",
                        file=sys.stderr,
                    )
                    starts.remove(start)
                    continue
                plans.append(_phases(side, counts, measured.setdefault(side.name, {})))
            for phase_on_each_side in zip(*plans, strict=True):
                for phase in phase_on_each_side:
                    _settle()
                    phase()
        for name, figures in measured.items():
            runs.setdefault(name, []).append(figures)
    return _figures(runs)


# (side, side it is compared with, the ratio's name): each figure of the first over the second's.
RATIOS = (
    (KITEQ, RABBITMQ, "KiteQ-py / RabbitMQ"),
    (KITEQ_MEMORY, KITEQ, "memory store / file store"),
)


def _figures(runs: dict[str, list[Figures]]) -> list[Figure]:
    """Each side's median run of every figure (with its conditions), then the RATIOS."""
    figures, medians = [], {}
    for side, measured in runs.items():
        for name, (_, unit, _) in measured[0].items():
            values = [run[name][0] for run in measured]
            median = statistics.median_low(values)
            params = measured[values.index(median)][name][2]
            figures.append(Figure(SUITE, f"{name} ({side})", median, unit, {"side": side, **params}, values))
            medians[side, name] = (median, values)
    for side, other, ratio in RATIOS:
        if side not in runs or other not in runs:
            continue
        for name in runs[side][0]:
            value, value_runs = medians[side, name]
            reference, reference_runs = medians[other, name]
            if all(reference_runs):  # no ratio to nothing (an idle CPU below a clock tick)
                # Run by run; a side that lost a run (RabbitMQ failing to start again) pairs fewer.
                ratios = [v / r for v, r in zip(value_runs, reference_runs, strict=False)]
                figures.append(Figure(SUITE, f"{name} ({ratio})", value / reference, "ratio", runs=ratios))
    return figures
