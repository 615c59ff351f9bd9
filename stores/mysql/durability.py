"""The master's settings that an acknowledged save's durability depends on.

A save is acknowledged once the master committed it, so a save is as durable as the
master's commit, and MariaDB's defaults do not make every commit durable: with the binary
log on (a replica needs it), InnoDB leaves a commit's durability to the binary log, and at
MariaDB's default `sync_binlog=0` the kernel writes that log back when it likes. A crash
of the master's machine then loses commits acknowledged before it. The store reads these
settings when it starts and warns of each one that weakens a save (docs/mysql-store.md,
"Setting it up"); this module is the rule, without I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The server variables the rule reads (SHOW GLOBAL VARIABLES names).
SETTINGS = ("innodb_flush_log_at_trx_commit", "log_bin", "sync_binlog")

# innodb_flush_log_at_trx_commit values that sync the redo log at every commit.
_SYNCED_COMMIT = ("1", "3")
_ON = ("1", "ON")


@dataclass(frozen=True, slots=True)
class Weakness:
    """A setting under which the master can lose a save it acknowledged."""

    setting: str
    value: str
    advice: str  # what to set, and what is lost otherwise

    def __str__(self) -> str:
        return f"{self.setting}={self.value}"


def weaknesses(settings: Mapping[str, str]) -> list[Weakness]:
    """The settings in `settings` (variable name -> value as the server shows it) that
    let the master lose acknowledged saves; a variable the server does not have is not
    judged (a MySQL-protocol server other than MariaDB may lack some)."""
    found = []
    flush = settings.get("innodb_flush_log_at_trx_commit")
    if flush is not None and flush not in _SYNCED_COMMIT:
        crash = "mariadbd or its machine crashes" if flush == "0" else "the master's machine crashes"
        found.append(
            Weakness(
                "innodb_flush_log_at_trx_commit",
                flush,
                f"set innodb_flush_log_at_trx_commit=1: at {flush} the saves acknowledged in about "
                f"the last second before {crash} are lost",
            )
        )
    sync = settings.get("sync_binlog")
    if settings.get("log_bin", "").upper() in _ON and sync is not None and sync != "1":
        found.append(
            Weakness(
                "sync_binlog",
                sync,
                "set sync_binlog=1: with the binary log on, MariaDB recovers a commit from that log, "
                f"which at sync_binlog={sync} is not synced at each commit, so a crash of the master's "
                "machine can lose acknowledged saves (and leave a replica with messages the master lost)",
            )
        )
    return found
