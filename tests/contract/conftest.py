"""Every store runs the same contract tests: add a store by adding a URI factory here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stores import open_store

# name -> function(tmp_path, request) returning a URI for a fresh, empty store.
STORE_URIS: dict[str, Callable[[Path, pytest.FixtureRequest], str]] = {
    "memory": lambda tmp_path, request: "memory://",
    "file": lambda tmp_path, request: f"file://{tmp_path}/store",
    "mysql": lambda tmp_path, request: request.getfixturevalue("mysql_store_uri"),
}


@pytest.fixture(params=sorted(STORE_URIS))
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return STORE_URIS[request.param](tmp_path, request)


@pytest.fixture
async def store(store_uri: str):
    """A fresh, started store of each kind."""
    async with open_store(store_uri) as opened:
        yield opened
