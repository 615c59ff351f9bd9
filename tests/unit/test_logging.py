"""Logging follows `sys.stderr` as it is now, so a swapped-out stream does not break it."""

from __future__ import annotations

import io
import sys

import pytest
import structlog

from kiteq.logging import MAX_VALUE_CHARS, configure_logging


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


def test_no_value_makes_a_log_line_longer_than_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    configure_logging("info", "json")
    structlog.get_logger("t").warning("auth.refused", group="g" * 2_000_000, reason="a\nforged line")
    configure_logging("info")
    line = out.getvalue()
    assert len(line) < 2 * MAX_VALUE_CHARS and "(2000000 characters)" in line
    assert line.count("\n") == 1, "a newline a client sent stays inside its value"
