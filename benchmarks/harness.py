"""What a benchmark suite returns, and how repeated runs become one figure."""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The project's root: where the suites start their client processes (`python -m benchmarks.…`).
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Figure:
    """One measured number: `name` says what, `unit` in what, `params` under which conditions."""

    suite: str
    name: str
    value: float
    unit: str
    params: dict[str, object] = field(default_factory=dict)
    runs: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


Report = dict[str, float]


def client_report(client: subprocess.Popen[str], timeout: float) -> Report:
    """A client process's JSON report, its last line; an incomplete run is an error (its
    report says how far it got)."""
    out, _ = client.communicate(timeout=timeout)
    last = out.strip().rpartition("\n")[2]
    if client.returncode or not last.startswith("{"):
        raise RuntimeError(f"{client.args!r} exited {client.returncode}: {last}")
    report: Report = json.loads(last)
    return report


def median_of(repeats: int, measure: Callable[[], float]) -> tuple[float, list[float]]:
    """Run `measure` `repeats` times; the median and every run."""
    runs = [measure() for _ in range(repeats)]
    return statistics.median(runs), runs


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) by nearest rank; 0.0 for no samples."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered)) - 1))
    return ordered[rank]
