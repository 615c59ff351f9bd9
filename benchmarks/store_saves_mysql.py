"""MySQL store saves: saves/s and p99 save latency at 1, 16 and 256 concurrent savers.

Starts its own MariaDB master + replica on this machine with the test launcher
(tests/services/mariadb.py, default durability: InnoDB flushes its log at every
commit), and measures each run on a fresh database exactly as `store_saves` does for
the memory and file stores (1 KiB bodies, N tasks each awaiting its own save), so
the figures compare. A save counts when it returned, i.e. when the master committed
it. Each figure is the median of the repeats.

Run alone: `python -m benchmarks.store_saves_mysql [--quick]` (JSON on stdout).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import trio

from benchmarks.harness import Figure, percentile
from benchmarks.store_saves import BODY, _save_all
from kiteq.logging import configure_logging
from stores.mysql import init_schema
from tests.services.mariadb import MariaDBPair, start_pair

SUITE = "store_saves_mysql"
CONCURRENCY = (1, 16, 256)
MESSAGES = {1: 2_000, 16: 10_000, 256: 40_000}
QUICK_MESSAGES = {1: 300, 16: 2_000, 256: 8_000}


async def _saves(uri: str, concurrency: int, count: int) -> tuple[float, float]:
    """(saves per second, p99 latency in ms): the file/memory stores' measurement, on MySQL."""
    rate, latencies = await _save_all(uri, {}, concurrency, count)
    return rate, percentile(latencies, 99) * 1000


def _measure(pair: MariaDBPair, concurrency: int, count: int) -> tuple[float, float]:
    """One run on a fresh database, dropped afterwards.

    A broker finishes what it delivered, so its tables stay near their working size;
    letting every run append to one database would grow it past the test server's
    128 MiB buffer pool and measure the disk's random reads instead of the store.
    """
    database = pair.new_database()
    uri = pair.uri(database)
    trio.run(init_schema, uri)
    try:
        return trio.run(_saves, uri, concurrency, count)
    finally:
        pair.master.execute(f"DROP DATABASE {database}")


def _figures(pair: MariaDBPair, quick: bool) -> list[Figure]:
    repeats = 1 if quick else 3
    figures = []
    for concurrency in CONCURRENCY:
        count = (QUICK_MESSAGES if quick else MESSAGES)[concurrency]
        runs = [_measure(pair, concurrency, count) for _ in range(repeats)]
        params = {
            "concurrency": concurrency,
            "messages": count,
            "body_bytes": BODY,
            "shards": 16,
            "servers": "local MariaDB master + replica",
            "repeats": repeats,
        }
        rates, p99s = [run[0] for run in runs], [run[1] for run in runs]
        figures.append(
            Figure(SUITE, f"mysql saves c={concurrency}", statistics.median(rates), "saves/s", params, rates)
        )
        figures.append(
            Figure(SUITE, f"mysql save p99 c={concurrency}", statistics.median(p99s), "ms", params, p99s)
        )
    return figures


def run(quick: bool) -> list[Figure]:
    pair = start_pair()
    try:
        return _figures(pair, quick)
    finally:
        pair.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.store_saves_mysql", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer messages, one repeat")
    args = parser.parse_args(argv)
    configure_logging("warning")
    json.dump([figure.to_json() for figure in run(args.quick)], sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
