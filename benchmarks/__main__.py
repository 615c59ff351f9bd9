"""Entry point of `make bench` / `python -m benchmarks [--quick] [--only SUITE…] [--messages N] [--out FILE]`."""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import json
import os
import platform
import sys
from pathlib import Path

from benchmarks import machine_speed

# Each module exposes `run(quick: bool) -> list[Figure]`; those whose `run` also takes
# `messages` get --messages.
SUITES = [
    "codec",
    "store_saves",
    "store_saves_mysql",
    "end_to_end",
    "reconcile",
    "versus_rabbitmq",
    "backlog",
    "delayed",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer messages and repeats (a smoke run)")
    parser.add_argument("--only", nargs="*", choices=SUITES, help="run only these suites")
    parser.add_argument(
        "--messages",
        type=int,
        help="messages per throughput phase, for the suites that take it (versus_rabbitmq, backlog)",
    )
    parser.add_argument(
        "--out", type=Path, help="JSON file to write (default benchmarks/results/<time>.json)"
    )
    args = parser.parse_args(argv)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or Path("benchmarks/results") / f"bench-{stamp}.json"
    speed_before = machine_speed.reading()
    figures = []
    for name in args.only or SUITES:
        module = importlib.import_module(f"benchmarks.{name}")
        takes_messages = "messages" in inspect.signature(module.run).parameters
        options = {"messages": args.messages} if args.messages and takes_messages else {}
        for figure in module.run(args.quick, **options):
            figures.append(figure.to_json())
            print(
                f"{figure.suite:12} {figure.name:48} {_shown(figure.value):>14} {figure.unit}  {figure.params}"
            )
    result = {
        "command": " ".join(
            [sys.executable, "-m", "benchmarks", *(argv if argv is not None else sys.argv[1:])]
        ),
        "time": stamp,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "interpreter": machine_speed.interpreter(),
            # machine_speed.py: how fast it ran, read before and after the suites.
            "speed_before": speed_before,
            "speed_after": machine_speed.reading(),
        },
        "figures": figures,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"results written to {out}")
    return 0


def _shown(value: float) -> str:
    """One decimal, except for small values (ratios, fractions of a core), which keep 3 digits."""
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"


if __name__ == "__main__":
    raise SystemExit(main())
