"""Message ids: what a KiteQ broker accepts, ordered by when they were made."""

from __future__ import annotations

import re
import time

import pytest

from kiteq.client import Message, new_message_id


def test_ids_are_32_lowercase_hex_characters_and_unique() -> None:
    ids = {new_message_id() for _ in range(10_000)}
    assert len(ids) == 10_000
    assert all(re.fullmatch(r"[0-9a-f]{32}", message_id) for message_id in ids)


def test_ids_sort_by_the_millisecond_they_were_made_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Brokers page due messages in id order: later ids come later (a backlog drains oldest first)."""
    made = []
    for now in (1_764_000_000.000, 1_764_000_000.001, 1_764_000_001.5, 1_764_000_060.0):
        monkeypatch.setattr(time, "time", lambda now=now: now)
        made.append(Message("trade", "pay", b"").message_id)
    assert made == sorted(made)
    assert made[0].startswith(f"{1_764_000_000_000:012x}"), "the first 48 bits are the milliseconds"
