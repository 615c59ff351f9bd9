"""The audit record's pure parts: who the caller is, and what a failed mutation still logs."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from kiteq.server.admin.audit import Caller, audited


def test_caller_of_a_request() -> None:
    assert Caller.of({"client": ("10.1.2.3", 40100)}, token=True) == Caller("10.1.2.3:40100", True)
    assert Caller.of({"client": None}, token=False) == Caller("unknown", False)


def test_a_mutation_logs_its_selection_count_and_caller() -> None:
    with (
        capture_logs() as logs,
        audited("purge", Caller("10.1.2.3:40100"), {"topic": "t", "group": ""}) as tally,
    ):
        tally.messages += 2
    assert logs == [
        {
            "event": "audit.purge",
            "log_level": "info",
            "selection": {"topic": "'t'"},
            "client": "10.1.2.3:40100",
            "auth": "none",
            "messages": 2,
        }
    ]


def test_a_mutation_failing_halfway_logs_what_it_touched() -> None:
    with (
        capture_logs() as logs,
        pytest.raises(OSError),
        audited("redrive", Caller("10.1.2.3:40100", True), {}) as tally,
    ):
        tally.messages += 1
        raise OSError("store went away")
    assert logs == [
        {
            "event": "audit.redrive",
            "log_level": "warning",
            "selection": "all",
            "client": "10.1.2.3:40100",
            "auth": "token",
            "messages": 1,
            "failed": "OSError",
        }
    ]
