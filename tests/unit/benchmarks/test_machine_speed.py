"""Every benchmark run records how fast the machine ran, before and after its suites (under
load and after idleness), and which interpreter ran it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import machine_speed
from benchmarks.__main__ import main


def test_a_run_records_the_machines_speed_before_and_after_its_suites(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    assert main(["--only", "codec", "--quick", "--out", str(out)]) == 0
    machine = json.loads(out.read_text())["machine"]
    for when in ("speed_before", "speed_after"):
        speed = machine[when]
        assert set(speed) == {
            "python_loop_step_ns",
            "syscall_ns",
            "round_trip_us",
            "round_trip_after_idle_us",
            "python_after_idle_ratio",
        }
        # A loop step takes tens of nanoseconds, a system call hundreds: neither is zero,
        # and neither a second (a reading in the wrong unit).
        assert 1 <= speed["python_loop_step_ns"] < 10_000
        assert 10 <= speed["syscall_ns"] < 1_000_000
        # A round trip between two processes is two system calls on each side and two
        # wake-ups: more than our side's two calls, well under the 5 ms pause of the idle
        # ones (a reading that counted the pause would exceed it).
        for round_trip in (speed["round_trip_us"], speed["round_trip_after_idle_us"]):
            assert 2 * speed["syscall_ns"] / 1000 < round_trip < 5_000
        assert 0.2 < speed["python_after_idle_ratio"] < 50
    interpreter = machine["interpreter"]
    assert interpreter["executable"] == os.path.realpath(sys.executable)
    # What the dynamic linker says of the executable, asked apart from the run's own reading.
    linked = subprocess.run(["ldd", sys.executable], capture_output=True, text=True, check=True).stdout
    assert interpreter["libpython_shared"] == ("libpython" in linked)


def _children() -> set[str]:
    return set(Path(f"/proc/self/task/{os.getpid()}/children").read_text().split())


def test_the_echo_process_of_the_round_trips_is_gone_once_they_are_read() -> None:
    before = _children()
    machine_speed.wake_reading()
    assert _children() <= before


def test_an_echo_process_that_does_not_answer_fails_the_reading_instead_of_hanging_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(machine_speed, "ECHO", "import time\ntime.sleep(600)")
    monkeypatch.setattr(machine_speed, "ECHO_TIMEOUT", 0.2)
    before = _children()
    with pytest.raises(TimeoutError):
        machine_speed.wake_reading()
    assert _children() <= before
