"""The asyncio side: coroutines that run on one aiomysql connection.

Each function takes the connection first and is called through `Server.call`, which
supplies the connection, the deadline and the error translation.

Batch functions run one transaction on the master as one multi-statement script
(`START TRANSACTION; …; COMMIT` in a single round trip) and report a result per item,
in item order. Their values are rendered into the SQL text with PyMySQL's own escape
functions — what the driver does for parameters — rows once each, in the saving
task (rows.values_sql). That is exact because every session runs with our sql_mode
(pools.SQL_MODE), which keeps backslash escapes on. When the same id appears twice in a batch, the
first occurrence carries the outcome and later ones see False for inserts and
deletes (the row was already taken by the first).
"""

from __future__ import annotations

import json
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pymysql
from pymysql.constants import ER
from pymysql.converters import escape_item

from stores.mysql.pools import Connection
from stores.mysql.statements import Sql, Statements

R = TypeVar("R")
DEADLOCK_RETRIES = 3


@dataclass(frozen=True, slots=True)
class SaveItem:
    shard: int
    message_id: str
    values: str  # the row as an SQL literal: "('id', 'topic', …)"


@dataclass(frozen=True, slots=True)
class UpdateItem:
    shard: int
    message_id: str
    succ_groups: str
    fail_groups: str
    deliver_count: int
    next_deliver_at: float


@dataclass(frozen=True, slots=True)
class FinishItem:
    shard: int
    message_id: str


@dataclass(frozen=True, slots=True)
class Result:
    rowcount: int
    rows: list[tuple[Any, ...]]


def literal(value: object) -> str:
    """`value` as an SQL literal (tuples and lists become `(a,b,…)`)."""
    return escape_item(value, "utf8mb4")


def render(statement: Sql, **values: object) -> str:
    return statement.text % tuple(literal(value) for value in statement.args(**values))


async def script(conn: Connection, statements: Sequence[str]) -> list[Result]:
    """Run `statements` in one round trip; one Result per statement, in order."""
    async with conn.cursor() as cursor:
        await cursor.execute(";\n".join(statements))
        results = [Result(cursor.rowcount, list(await cursor.fetchall()))]
        while await cursor.nextset():
            results.append(Result(cursor.rowcount, list(await cursor.fetchall())))
    return results


async def retrying(conn: Connection, attempt: Callable[[], Awaitable[R]]) -> R:
    """Run a transaction `attempt`; a deadlock or lock-wait victim is rolled back and rerun."""
    for number in range(DEADLOCK_RETRIES):
        try:
            return await attempt()
        except pymysql.err.OperationalError as exc:
            if exc.args[0] not in (ER.LOCK_DEADLOCK, ER.LOCK_WAIT_TIMEOUT) or number == DEADLOCK_RETRIES - 1:
                raise
            await conn.rollback()
    raise AssertionError("unreachable")


async def transaction(conn: Connection, statements: Sequence[str]) -> list[Result]:
    """`statements` in one transaction and one round trip; their Results."""

    async def attempt() -> list[Result]:
        return (await script(conn, ["START TRANSACTION", *statements, "COMMIT"]))[1:-1]

    return await retrying(conn, attempt)


def _by_shard(items: Sequence[Any]) -> dict[int, list[Any]]:
    """Items grouped by shard, shards in ascending order (one lock order for every batch)."""
    groups: dict[int, list[Any]] = defaultdict(list)
    for item in items:
        groups[item.shard].append(item)
    return dict(sorted(groups.items()))


def _first_takes_it(ids: Sequence[str], taken: set[str]) -> list[bool]:
    """True for the first occurrence of each id in `taken`, False for the rest."""
    results = []
    for message_id in ids:
        results.append(message_id in taken)
        taken.discard(message_id)
    return results


async def insert_batch(conn: Connection, sql: Statements, items: Sequence[SaveItem]) -> list[bool]:
    """Multi-row INSERT IGNORE … RETURNING per shard; True where this batch created the row."""
    inserts = [
        sql.shards[shard].insert([item.values for item in group]) for shard, group in _by_shard(items).items()
    ]
    inserted = {row[0] for result in await transaction(conn, inserts) for row in result.rows}
    return _first_takes_it([item.message_id for item in items], inserted)


async def finish_batch(conn: Connection, sql: Statements, items: Sequence[FinishItem]) -> list[bool]:
    """DELETE … RETURNING per shard; True where this batch deleted the row."""
    deletes = [
        render(sql.shards[shard].finish, ids=[item.message_id for item in group])
        for shard, group in _by_shard(items).items()
    ]
    deleted = {row[0] for result in await transaction(conn, deletes) for row in result.rows}
    return _first_takes_it([item.message_id for item in items], deleted)


async def update_batch(conn: Connection, sql: Statements, items: Sequence[UpdateItem]) -> list[bool]:
    """Delivery results per shard in one UPDATE joined to a JSON list; True where the row exists.

    The last item for an id wins (it was submitted last). Matched rows are counted with
    CLIENT_FOUND_ROWS; only when some id matched nothing are that shard's ids looked
    up, under lock, to tell which ones exist (a second round trip, then COMMIT).
    """
    latest = {item.message_id: item for item in items}
    groups = _by_shard(list(latest.values()))
    updates = {
        shard: sql.shards[shard].update_delivery
        % literal(
            json.dumps(
                [
                    [i.message_id, i.succ_groups, i.fail_groups, i.deliver_count, i.next_deliver_at]
                    for i in group
                ]
            )
        )
        for shard, group in groups.items()
    }

    async def attempt() -> set[str]:
        results = (await script(conn, ["START TRANSACTION", *updates.values()]))[1:]
        updated: set[str] = set()
        unsure: dict[int, int] = {}
        for (shard, group), result in zip(groups.items(), results, strict=True):
            if result.rowcount == len(group):
                updated.update(item.message_id for item in group)
            else:
                unsure[shard] = result.rowcount
        for shard, matched in unsure.items():
            locate = render(sql.shards[shard].locate, ids=[item.message_id for item in groups[shard]])
            found = {row[0] for row in (await script(conn, [locate]))[0].rows}
            if len(found) > matched:
                # Rows saved after the UPDATE ran: update them too, now that they are locked.
                await script(conn, [updates[shard]])
            updated |= found
        await script(conn, ["COMMIT"])
        return updated

    updated = await retrying(conn, attempt)
    return [item.message_id in updated for item in items]


async def execute(conn: Connection, text: str, args: Sequence[object]) -> int:
    """One autocommitted statement; the number of rows it matched."""
    async with conn.cursor() as cursor:
        matched: int = await cursor.execute(text, args)
        return matched


async def fetch_one(conn: Connection, text: str, args: Sequence[object]) -> tuple[Any, ...] | None:
    async with conn.cursor() as cursor:
        await cursor.execute(text, args)
        row: tuple[Any, ...] | None = await cursor.fetchone()
        return row


async def fetch_all(conn: Connection, text: str, args: Sequence[object]) -> list[tuple[Any, ...]]:
    async with conn.cursor() as cursor:
        await cursor.execute(text, args)
        return list(await cursor.fetchall())


async def server_variables(conn: Connection, names: Sequence[str]) -> dict[str, str]:
    """The server's global variables among `names` (those it has), values as it shows them."""
    marks = ", ".join(["%s"] * len(names))
    rows = await fetch_all(conn, f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({marks})", names)
    return {str(name): str(value) for name, value in rows}


async def binlog_position(conn: Connection) -> str:
    """The master's last written GTID position (what a replica must reach to be current)."""
    row = await fetch_one(conn, "SELECT @@global.gtid_binlog_pos", ())
    return str(row[0]) if row else ""


async def replica_status(conn: Connection) -> dict[str, Any]:
    """`SHOW SLAVE STATUS` as a dict; empty when the server replicates from nobody."""
    async with conn.cursor() as cursor:
        await cursor.execute("SHOW SLAVE STATUS")
        row = await cursor.fetchone()
        if row is None:
            return {}
        return dict(zip((column[0] for column in cursor.description), row, strict=True))


# Which database each replica connection has selected (aiomysql does not record it).
_selected: weakref.WeakKeyDictionary[Connection, str] = weakref.WeakKeyDictionary()


class ReplicaBehind(Exception):
    """The replica did not reach the master's position in time; read elsewhere."""


async def fetch_all_caught_up(
    conn: Connection, database: str, position: str | None, wait: float, text: str, args: Sequence[object]
) -> list[tuple[Any, ...]]:
    """`fetch_all` on a replica once it has applied everything up to `position`.

    Replica connections open without a default database (a database created moments
    ago on the master may not exist there yet); it is selected after the wait.
    """
    if position:
        row = await fetch_one(conn, "SELECT MASTER_GTID_WAIT(%s, %s)", (position, wait))
        if not row or row[0] != 0:
            raise ReplicaBehind(position)
    if _selected.get(conn) != database:
        await conn.select_db(database)
        _selected[conn] = database
    return await fetch_all(conn, text, args)
