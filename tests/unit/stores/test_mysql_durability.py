"""Which of a MySQL master's settings let it lose a save it acknowledged (no database needed)."""

from __future__ import annotations

import pytest

from stores.mysql.durability import weaknesses

DURABLE = {"innodb_flush_log_at_trx_commit": "1", "log_bin": "ON", "sync_binlog": "1"}


@pytest.mark.parametrize(
    ("settings", "weak"),
    [
        (DURABLE, []),
        ({**DURABLE, "innodb_flush_log_at_trx_commit": "3"}, []),
        ({**DURABLE, "sync_binlog": "0"}, ["sync_binlog=0"]),
        ({**DURABLE, "sync_binlog": "100"}, ["sync_binlog=100"]),
        ({**DURABLE, "log_bin": "OFF", "sync_binlog": "0"}, []),  # no binary log: InnoDB's own sync decides
        ({**DURABLE, "log_bin": "1", "sync_binlog": "0"}, ["sync_binlog=0"]),  # as SELECT @@log_bin shows it
        ({**DURABLE, "innodb_flush_log_at_trx_commit": "2"}, ["innodb_flush_log_at_trx_commit=2"]),
        (
            {"innodb_flush_log_at_trx_commit": "0", "log_bin": "ON", "sync_binlog": "0"},
            ["innodb_flush_log_at_trx_commit=0", "sync_binlog=0"],
        ),
        ({}, []),  # a server without these variables is not judged
        ({"log_bin": "ON"}, []),
    ],
)
def test_weak_settings_are_named(settings: dict[str, str], weak: list[str]) -> None:
    assert [str(weakness) for weakness in weaknesses(settings)] == weak


def test_the_advice_says_what_to_set_and_what_is_lost() -> None:
    flush_0, sync_0 = weaknesses({"innodb_flush_log_at_trx_commit": "0", "log_bin": "ON", "sync_binlog": "0"})
    assert flush_0.advice.startswith("set innodb_flush_log_at_trx_commit=1:")
    assert "mariadbd or its machine crashes" in flush_0.advice
    (flush_2,) = weaknesses({"innodb_flush_log_at_trx_commit": "2"})
    assert "mariadbd" not in flush_2.advice, "at 2 only a crash of the machine loses saves"
    assert sync_0.advice.startswith("set sync_binlog=1:") and "sync_binlog=0" in sync_0.advice
