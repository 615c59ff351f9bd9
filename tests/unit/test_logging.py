"""Logging follows `sys.stderr` as it is now, so a swapped-out stream does not break it."""

from __future__ import annotations

import io
import sys

import pytest
import structlog

from kiteq.logging import configure_logging


def test_logs_go_to_the_current_stderr_even_after_the_one_at_configuration_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("info")
    structlog.get_logger("t").info("to.first")
    assert "to.first" in first.getvalue()
    first.close()  # as pytest's capture closes a finished test's stream
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    structlog.get_logger("t").warning("to.second")
    assert "to.second" in second.getvalue()
    configure_logging("info")
