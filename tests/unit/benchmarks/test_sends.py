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


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("events", "ack_p50", "ack_p99"),
    [
        # One at a time: each send confirmed 2 ms after it left.
        ([("left", 0, 0.0), ("confirm", [0], 0.002), ("left", 1, 0.003), ("confirm", [1], 0.005)], 2.0, 2.0),
        # One confirm for several (a publisher confirm with `multiple`), each counted from its own hand-off.
        ([("left", 0, 0.0), ("left", 1, 0.004), ("confirm", [0, 1], 0.010)], 6.0, 10.0),
        # Out of order (the first refused, say, and resent: handed to the library once).
        ([("left", 0, 0.0), ("left", 1, 0.001), ("confirm", [1], 0.002), ("confirm", [0], 0.031)], 1.0, 31.0),
    ],
    ids=["one at a time", "one confirm for several", "out of order"],
)
def test_a_sends_ack_wait_runs_from_its_hand_off_to_its_confirmation(
    events: list[tuple[str, object, float]], ack_p50: float, ack_p99: float
) -> None:
    clock = FakeClock()
    sends = Sends(2, None, 100, clock)
    for kind, what, at in events:
        clock.now = at
        if kind == "left":
            assert isinstance(what, int)
            sends.left(what)
        else:
            assert isinstance(what, list)
            sends.confirm(what)
    report = sends.report()
    assert report["ack_p50_ms"] == pytest.approx(ack_p50)
    assert report["ack_p99_ms"] == pytest.approx(ack_p99)
    assert "late_p50_ms" not in report  # unpaced: no schedule to be late for


def test_a_body_names_its_send() -> None:
    sends = Sends(3, None, 1000)
    assert [sends.index_of(sends.body(index)) for index in range(3)] == [0, 1, 2]
