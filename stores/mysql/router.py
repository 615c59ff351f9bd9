"""Where scans run: the replica while it is usable, else the master.

Usable means reachable, its SQL thread running and `Seconds_Behind_Master` known and
at most `replica_max_lag`; that is checked at most once per `CHECK_EVERY` seconds, on
the scan path, and every change is logged both ways. On top of that bound, each scan
first reads the master's binlog position and waits (`MASTER_GTID_WAIT`, up to
`CATCH_UP`) until the replica has applied it, so a scan on the replica sees every
write this or any broker committed before the scan began; if it cannot catch up in
time that page is read on the master. When the master is unreachable, the replica
is read as it is (better a slightly stale recovery scan than none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog
import trio

from stores.errors import StoreError, StoreUnavailable
from stores.mysql import queries
from stores.mysql.pools import Server
from stores.mysql.uri import MySQLConfig

CHECK_EVERY = 1.0
CATCH_UP = 1.0


class ScanRouter:
    """Runs read-only scans on the replica or the master and reports which."""

    def __init__(self, master: Server, replica: Server | None, config: MySQLConfig) -> None:
        self._master = master
        self._replica = replica
        self._database = config.database
        self._max_lag = config.replica_max_lag
        self._check_timeout = min(config.timeout, 1.0)
        self._checked_at = -float("inf")
        self._checking = trio.Lock()
        self._usable = False
        self._reason = "not checked yet" if replica else "no replica configured"
        self._lag: float | None = None
        self._catch_up_misses = 0
        self._stale_reads = 0
        self._log = structlog.get_logger(__name__).bind(
            master=str(master.endpoint), replica=str(replica.endpoint) if replica else None
        )

    @property
    def source(self) -> str:
        return "replica" if self._usable else "master"

    def details(self) -> dict[str, object]:
        return {
            "scans_on": self.source,
            "replica": str(self._replica.endpoint) if self._replica else None,
            "replica_state": self._reason,
            "replica_lag_s": self._lag,
            "replica_catch_up_misses": self._catch_up_misses,
            "stale_replica_reads": self._stale_reads,
        }

    async def fetch_all(self, text: str, args: Sequence[object]) -> list[tuple[Any, ...]]:
        """The rows of a read-only query, from the best source available now."""
        await self._check()
        if self._replica is not None and self._usable:
            try:
                position = await self._master.call(queries.binlog_position, timeout=self._check_timeout)
            except StoreUnavailable:
                position = None
            try:
                return await self._replica.call(
                    queries.fetch_all_caught_up, self._database, position, CATCH_UP, text, args
                )
            except queries.ReplicaBehind:
                self._catch_up_misses += 1
            except StoreError as exc:
                self._set(False, f"failed: {exc}", None)
        try:
            return await self._master.call(queries.fetch_all, text, args)
        except StoreUnavailable:
            if self._replica is None:
                raise
            rows = await self._replica.call(
                queries.fetch_all_caught_up, self._database, None, 0.0, text, args
            )
            self._stale_reads += 1
            self._log.warning("mysql.scan.stale_replica_read", reason="master unavailable")
            return rows

    async def _check(self) -> None:
        """Refresh the replica's state if the last check is older than CHECK_EVERY."""
        if (
            self._replica is None
            or self._checking.locked()
            or trio.current_time() - self._checked_at < CHECK_EVERY
        ):
            return
        async with self._checking:
            self._checked_at = trio.current_time()
            try:
                status = await self._replica.call(queries.replica_status, timeout=self._check_timeout)
            except StoreUnavailable as exc:
                self._set(False, f"unreachable: {exc}", None)
                return
            lag = status.get("Seconds_Behind_Master")
            if not status:
                self._set(False, "not replicating (SHOW SLAVE STATUS is empty)", None)
            elif status.get("Slave_SQL_Running") != "Yes":
                self._set(
                    False, f"SQL thread stopped: {status.get('Last_SQL_Error') or 'no error given'}", None
                )
            elif lag is None:
                self._set(False, f"lag unknown (IO thread {status.get('Slave_IO_Running')})", None)
            elif lag > self._max_lag:
                self._set(False, f"lagging {lag} s > replica_max_lag {self._max_lag:g} s", float(lag))
            else:
                self._set(True, "replicating", float(lag))

    def _set(self, usable: bool, reason: str, lag: float | None) -> None:
        self._lag = lag
        self._reason = reason
        if usable == self._usable:
            return
        self._usable = usable
        if usable:
            self._log.info("mysql.scans.switched", to="replica", reason=reason, lag_s=lag)
        else:
            self._log.warning("mysql.scans.switched", to="master", reason=reason)
