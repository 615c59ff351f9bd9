"""Store saves: saves/s and save latency (p50/p99) by fsync mode and concurrency, and recovery time.

Every save is a 1 KiB message. `concurrency` tasks save in a loop, each waiting for
its own save before the next (as a producer connection waits for its store ack),
so concurrency is the number of saves in flight. Entities are built before the
clock starts: the figures are the store's. Recovery is timed in a fresh child
process (start() of a store holding N unfinished messages), which also reports
the process's RSS afterwards: the memory the index costs. Three recoveries are
timed: after SIGKILL (the snapshots taken while saving, then the data written
since the last), after a clean stop (the snapshot written at close), and from the
data segments alone (no snapshot: the worst case). Then `kiteq-server` itself is
started on the store (the snapshot of the clean stop): its RSS once it serves is
what a broker holding N unfinished messages costs, index and every module loaded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import trio

from benchmarks.harness import ROOT, Figure, percentile
from kiteq.logging import configure_logging
from stores import MessageEntity, open_store
from tests.procs.broker import BrokerProcess
from tests.procs.memory import memory_of
from tests.services.ports import wait_for_port

SUITE = "store_saves"
BODY = 1024
CONCURRENCY = (1, 16, 256)
# (store, fsync mode): the memory store is the reference without any I/O.
CONFIGS = (("memory", None), ("file", "always"), ("file", "batch"), ("file", "never"))


def _entities(count: int) -> list[MessageEntity]:
    body = os.urandom(BODY)
    now = time.time()
    return [
        MessageEntity(
            message_id=uuid.uuid4().hex,
            topic="trade",
            message_type="pay-succ",
            producer_group="order-svc",
            body=body,
            created_at=now,
            next_deliver_at=now + 3600,
        )
        for _ in range(count)
    ]


async def _save_all(
    uri: str, options: dict[str, object], concurrency: int, count: int
) -> tuple[float, list[float]]:
    """(saves per second, latency of each save in seconds)."""
    entities = _entities(count)
    latencies: list[float] = []

    async with open_store(uri, **options) as store:

        async def saver(chunk: list[MessageEntity]) -> None:
            clock = time.perf_counter
            for entity in chunk:
                started = clock()
                await store.save(entity)
                latencies.append(clock() - started)

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(concurrency):
                nursery.start_soon(saver, entities[i::concurrency])
        elapsed = time.perf_counter() - started
    return count / elapsed, latencies


def _count(store: str, mode: str | None, concurrency: int, quick: bool) -> int:
    """Enough saves for a steady rate, few enough that fsync-bound runs stay short."""
    if store == "file" and mode != "never" and concurrency == 1:
        count = 1_000
    else:
        count = {1: 10_000, 16: 30_000, 256: 60_000}[concurrency]
    return count // 10 if quick else count


def measure_saves(store: str, mode: str | None, concurrency: int, quick: bool) -> list[Figure]:
    repeats = 1 if quick else 3
    count = _count(store, mode, concurrency, quick)
    rates, p50s, p99s = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="kiteq-bench-") as tmp:
            uri = "memory://" if store == "memory" else f"file://{tmp}/store"
            options: dict[str, object] = {} if mode is None else {"fsync": mode}
            rate, latencies = trio.run(_save_all, uri, options, concurrency, count)
        rates.append(rate)
        p50s.append(percentile(latencies, 50) * 1000)
        p99s.append(percentile(latencies, 99) * 1000)
    params = {
        "store": store,
        "fsync": mode or "-",
        "concurrency": concurrency,
        "body_bytes": BODY,
        "saves": count,
    }
    return [
        Figure(
            SUITE,
            f"save rate {store} fsync={mode or '-'} c={concurrency}",
            _median(rates),
            "saves/s",
            params,
            rates,
        ),
        Figure(
            SUITE, f"save p50 {store} fsync={mode or '-'} c={concurrency}", _median(p50s), "ms", params, p50s
        ),
        Figure(
            SUITE, f"save p99 {store} fsync={mode or '-'} c={concurrency}", _median(p99s), "ms", params, p99s
        ),
    ]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def fill_and_wait(uri: str, count: int) -> None:
    """Save `count` unfinished messages (fsync=batch, 256 at a time), say `filled`, wait to be killed."""
    async with open_store(uri) as store:
        for start in range(0, count, 100_000):
            entities = _entities(min(100_000, count - start))

            async def saver(chunk: list[MessageEntity]) -> None:
                for entity in chunk:
                    await store.save(entity)

            async with trio.open_nursery() as nursery:
                for i in range(256):
                    nursery.start_soon(saver, entities[i::256])
        print("filled", flush=True)
        await trio.sleep_forever()


# Child processes, so each recovery starts cold and its RSS is the store's alone.
_FILL = """
import sys, trio
from kiteq.logging import configure_logging
from benchmarks.store_saves import fill_and_wait
configure_logging("warning")
trio.run(fill_and_wait, sys.argv[1], int(sys.argv[2]))
"""
_RECOVER = """
import json, sys, time, trio
from kiteq.logging import configure_logging
from stores import open_store
from tests.procs.memory import memory_of
configure_logging("warning")

async def main(uri):
    store = open_store(uri)
    started = time.perf_counter()
    await store.start()
    elapsed = time.perf_counter() - started
    stats = await store.stats()
    rss, peak_rss = memory_of("self")
    await store.close()
    print(json.dumps({"seconds": elapsed, "messages": stats.messages, "rss": rss, "peak_rss": peak_rss}))


trio.run(main, sys.argv[1])
"""


def _child(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )


def _recover(uri: str, count: int, repeats: int) -> list[dict[str, float]]:
    """Start the store read-only (nothing written, so every run recovers the same files) `repeats` times."""
    results = []
    for _ in range(repeats):
        child = _child(_RECOVER, f"{uri}?read_only=true")
        out, _ = child.communicate()
        if child.returncode:
            raise RuntimeError(f"recovery failed with exit code {child.returncode}")
        results.append(json.loads(out))
    if any(result["messages"] != count for result in results):
        raise RuntimeError(f"recovery found {[r['messages'] for r in results]} messages, expected {count}")
    return results


def measure_recovery(quick: bool) -> list[Figure]:
    """Recovery of N unfinished messages after SIGKILL, after a clean stop, and from data alone."""
    count = 100_000 if quick else 1_000_000
    repeats = 1 if quick else 3
    params = {"messages": count, "body_bytes": BODY, "fsync": "batch"}
    figures = []
    with tempfile.TemporaryDirectory(prefix="kiteq-bench-") as tmp:
        directory = Path(tmp) / "store"
        uri = f"file://{directory}"
        filler = _child(_FILL, uri, str(count))
        assert filler.stdout is not None
        if filler.stdout.readline().strip() != "filled":
            raise RuntimeError(f"the fill failed with exit code {filler.wait()}")
        filler.send_signal(signal.SIGKILL)
        filler.wait()
        cases = [("after SIGKILL", "snapshots taken while saving, then the data since the last")]
        results = [_recover(uri, count, repeats)]
        trio.run(_open_and_close, uri)
        cases.append(("after a clean stop", "the snapshot written at close"))
        results.append(_recover(uri, count, repeats))
        broker_rss, broker_peak = trio.run(_broker_memory, directory)
        for snapshot in directory.glob("*.snap"):
            snapshot.unlink()
        cases.append(("from data segments alone", "no snapshot: every record of every segment"))
        results.append(_recover(uri, count, repeats))
    for (case, reads), runs in zip(cases, results, strict=True):
        seconds = [r["seconds"] for r in runs]
        rss = [r["rss"] / 2**20 for r in runs]
        figures += [
            Figure(
                SUITE, f"recovery time ({case})", _median(seconds), "s", {**params, "reads": reads}, seconds
            ),
            Figure(
                SUITE,
                f"RSS after recovery ({case})",
                _median(rss),
                "MiB",
                {**params, "process": "store only"},
                rss,
            ),
        ]
    peak = [r["peak_rss"] / 2**20 for runs in results for r in runs]
    figures.append(Figure(SUITE, "peak RSS during recovery", max(peak), "MiB", params, peak))
    broker_params = {**params, "process": "kiteq-server", "reads": "the snapshot written at close"}
    figures += [
        Figure(SUITE, "broker RSS serving the stored messages", broker_rss / 2**20, "MiB", broker_params),
        Figure(SUITE, "broker peak RSS while starting", broker_peak / 2**20, "MiB", broker_params),
    ]
    return figures


async def _broker_memory(directory: Path) -> tuple[int, int]:
    """Start kiteq-server on the store; its memory once it serves. Its admin port opens
    only after the store has recovered, so that is the moment to read."""
    broker = BrokerProcess(
        directory.parent, f"file://{directory.parent}/registry.json", store=f"file://{directory}"
    )
    await broker.start()
    try:
        await trio.to_thread.run_sync(wait_for_port, broker.admin_port, 120.0)
        assert broker.process is not None
        return memory_of(broker.process.pid)
    finally:
        await broker.stop()


async def _open_and_close(uri: str) -> None:
    async with open_store(uri):
        pass


def run(quick: bool) -> list[Figure]:
    configure_logging("warning")  # the stores' info lines would drown the figures
    figures = []
    for store, mode in CONFIGS:
        for concurrency in CONCURRENCY:
            figures += measure_saves(store, mode, concurrency, quick)
    figures += measure_recovery(quick)
    return figures
