"""The commands' `main` configures logging for the whole process: keep that inside these tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kiteq.logging import configure_logging


@pytest.fixture(autouse=True)
def _command_logging() -> Iterator[None]:
    """Errors only, kiteq-admin's default, whichever test runs first; then back to the
    level tests/conftest.py sets, so later tests still capture info events."""
    configure_logging("error")
    yield
    configure_logging("info")
