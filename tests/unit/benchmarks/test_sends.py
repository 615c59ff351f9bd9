"""A producer's report: the rate over each tenth of its confirmations."""

from __future__ import annotations

import pytest

from benchmarks.clients.workload import Sends


def confirmed_at(times: list[float]) -> Sends:
    sends = Sends(len(times), None, 0)
    sends.started = 0.0
    sends.confirmed = times
    return sends


@pytest.mark.parametrize(
    ("times", "tenths"),
    [
        # 1,000 confirmations, one a millisecond: 1,000/s in every tenth.
        ([(i + 1) / 1000 for i in range(1000)], [1000.0] * 10),
        # The same, the seventh tenth at half the pace: a dip, not a fall.
        (
            [(i + 1) / 1000 + (min(max(i - 599, 0), 100) / 1000) for i in range(1000)],
            [1000.0] * 6 + [500.0] + [1000.0] * 3,
        ),
        # Each tenth slower than the one before: a fall.
        (
            [
                t
                for k in range(10)
                for t in [sum(1 + j for j in range(k)) + (i + 1) * (k + 1) / 100 for i in range(100)]
            ],
            [100.0 / (k + 1) for k in range(10)],
        ),
        # Fewer than ten: the empty tenths have no rate.
        ([1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
    ],
    ids=["steady", "dip", "fall", "fewer than ten"],
)
def test_each_tenth_has_its_own_rate(times: list[float], tenths: list[float]) -> None:
    assert confirmed_at(times).tenth_rates() == pytest.approx(tenths)


def test_the_report_takes_its_first_and_last_tenth_from_the_tenths() -> None:
    sends = confirmed_at([(i + 1) / 1000 + (i >= 900) * (i - 899) / 1000 for i in range(1000)])
    report = sends.report()
    assert report["tenth_rates"] == sends.tenth_rates()
    assert report["first_tenth_rate"] == pytest.approx(1000.0)
    assert report["last_tenth_rate"] == pytest.approx(500.0)
    assert report["rate"] == pytest.approx(1000 / 1.1)
