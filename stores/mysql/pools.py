"""aiomysql pools to the master and the replica, called from Trio with a deadline.

`Server.call(fn, *args)` runs the asyncio coroutine function `fn(conn, *args)` on a
pooled connection under `trio.fail_after`, and turns every driver failure into a
typed store error: unreachable, timed out or overloaded -> StoreUnavailable (retry
later); a missing schema -> StoreConfigError; anything else -> StoreError. A
connection that saw any failure (or a cancellation mid-query) is closed, never
returned to the pool, so the next call starts on a clean one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pymysql
import trio
from pymysql.constants import CLIENT, ER

from stores.errors import StoreConfigError, StoreError, StoreUnavailable
from stores.mysql.bridge import AsyncioBridge
from stores.mysql.driver import QuietCursor, aiomysql
from stores.mysql.uri import Endpoint, MySQLConfig

R = TypeVar("R")
Connection = aiomysql.Connection

# READ COMMITTED: batch statements lock only the rows they touch (no gap locks on
# absent ids that would block concurrent inserts); safe with binlog_format=ROW.
INIT_COMMAND = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
SQL_MODE = "TRADITIONAL"
_CONFIG_ERRORS = {ER.ACCESS_DENIED_ERROR, ER.DBACCESS_DENIED_ERROR, ER.BAD_DB_ERROR, ER.NO_SUCH_TABLE}
# Server errors that mean "not now" rather than "not this": retrying later can succeed.
# (A read-only server, 1290, is a master being failed over.)
_TRANSIENT_ERRORS = {
    ER.CON_COUNT_ERROR,
    ER.SERVER_SHUTDOWN,
    ER.NET_READ_ERROR,
    ER.NET_READ_INTERRUPTED,
    ER.NET_ERROR_ON_WRITE,
    ER.NET_WRITE_INTERRUPTED,
    ER.TOO_MANY_USER_CONNECTIONS,
    ER.LOCK_WAIT_TIMEOUT,
    ER.LOCK_DEADLOCK,
    ER.OPTION_PREVENTS_STATEMENT,
    ER.QUERY_INTERRUPTED,
    1927,  # ER_CONNECTION_KILLED (MariaDB)
}
_CLIENT_ERRORS = range(2000, 3000)  # CR_*: the client lost or never had the connection


def init_hint(config: MySQLConfig) -> str:
    return f"run `kiteq-admin store init --store {config.redacted()}`"


def translate(exc: BaseException, where: str, config: MySQLConfig) -> StoreError:
    """The typed store error for a driver failure on `where` (master or replica)."""
    code = exc.args[0] if isinstance(exc, pymysql.err.MySQLError) and exc.args else None
    if code in _CONFIG_ERRORS:
        hint = (
            init_hint(config)
            if code in (ER.BAD_DB_ERROR, ER.NO_SUCH_TABLE)
            else "check the user and password"
        )
        return StoreConfigError(
            f"MySQL {where} refused: {exc.args[1] if len(exc.args) > 1 else exc} ({code}); {hint}"
        )
    if (
        isinstance(exc, OSError | pymysql.err.InterfaceError)
        or code in _TRANSIENT_ERRORS
        or (isinstance(code, int) and code in _CLIENT_ERRORS)
    ):
        return StoreUnavailable(f"MySQL {where} is unavailable: {exc}; retry later")
    return StoreError(f"MySQL {where} failed: {exc!r}")


class Server:
    """One MariaDB server (the master or the replica) and its aiomysql pool."""

    def __init__(
        self,
        role: str,
        endpoint: Endpoint,
        config: MySQLConfig,
        bridge: AsyncioBridge,
        *,
        maxsize: int,
        use_database: bool = True,
    ) -> None:
        self.role = role
        self.endpoint = endpoint
        self._config = config
        self._bridge = bridge
        self._maxsize = maxsize
        self._database = config.database if use_database else None
        self._pool: aiomysql.Pool | None = None

    @property
    def where(self) -> str:
        return f"{self.role} {self.endpoint}"

    async def open(self, *, connect: bool) -> None:
        """Create the pool; with `connect`, fail now (typed) if the server cannot be reached."""
        self._pool = await self._call(
            self._create_pool, 1 if connect else 0, timeout=self._config.connect_timeout * 2 + 1
        )

    async def call(self, fn: Callable[..., Awaitable[R]], *args: Any, timeout: float | None = None) -> R:
        """`await fn(conn, *args)` on a pooled connection within `timeout` (default: the store's)."""
        if self._pool is None:
            raise StoreUnavailable(f"MySQL {self.where} pool is not open")
        return await self._call(_with_connection, self._pool, fn, *args, timeout=timeout)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            with trio.move_on_after(self._config.timeout) as scope:
                scope.shield = True
                await self._bridge.run(_close_pool, pool)

    async def _call(
        self, fn: Callable[..., Coroutine[Any, Any, R]], *args: Any, timeout: float | None = None
    ) -> R:
        limit = self._config.timeout if timeout is None else timeout
        try:
            with trio.fail_after(limit):
                return await self._bridge.run(fn, *args)
        except trio.TooSlowError:
            raise StoreUnavailable(
                f"MySQL {self.where} did not answer within {limit:g} s; retry later"
            ) from None
        except (pymysql.err.MySQLError, OSError) as exc:
            raise translate(exc, self.where, self._config) from exc

    async def _create_pool(self, minsize: int) -> aiomysql.Pool:
        return await aiomysql.create_pool(
            minsize=minsize,
            maxsize=self._maxsize,
            host=self.endpoint.host,
            port=self.endpoint.port,
            user=self._config.user,
            password=self._config.password,
            db=self._database,
            charset="utf8mb4",
            autocommit=True,
            connect_timeout=self._config.connect_timeout,
            client_flag=CLIENT.FOUND_ROWS,
            sql_mode=SQL_MODE,
            init_command=INIT_COMMAND,
            pool_recycle=3600,
            cursorclass=QuietCursor,
        )


async def _with_connection(pool: aiomysql.Pool, fn: Callable[..., Awaitable[R]], *args: Any) -> R:
    conn = await pool.acquire()
    try:
        return await fn(conn, *args)
    except BaseException:
        conn.close()
        raise
    finally:
        pool.release(conn)


async def _close_pool(pool: aiomysql.Pool) -> None:
    pool.close()
    await pool.wait_closed()
