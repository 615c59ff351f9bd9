"""The MySQL store's tables, defined once with SQLAlchemy Core, and their life cycle.

Layout (version `SCHEMA_VERSION`):

- `kite_meta(name, value)`: `schema_version` and `shards`. The shard count is fixed
  when the schema is created: a message's table is `crc32(message_id) % shards`, so
  opening the database with another count would lose messages; it is refused.
- `kite_msg_0 .. kite_msg_{N-1}`: one row per message, every header field in its own
  column, the body, and the broker's delivery state. Indexes make each scan an index
  range scan in the scan's own order (the page cursor is the last row's index key):

  | index | serves |
  |---|---|
  | `idx_due (broker, committed, dead, next_deliver_at, message_id)` | `page_due` |
  | `idx_uncommitted (broker, committed, dead, created_at, message_id)` | `page_uncommitted` |
  | `idx_dead (dead, message_id, dead_reason)` | `page_dead`, dead counts (index only) |
  | `idx_backlog (broker, dead, committed, topic)` | `stats` counts (index only) |

`init_schema(uri)` creates what is missing (idempotent; `kiteq-admin store init`);
`check_schema(uri)` and the store's `start()` refuse a missing, older or newer schema
or a different shard count with a StoreConfigError that says what to run.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql import mariadb
from sqlalchemy.schema import CreateTable

from stores.errors import StoreConfigError
from stores.mysql.bridge import AsyncioBridge
from stores.mysql.pools import Connection, Server, init_hint
from stores.mysql.uri import MySQLConfig, parse_uri

SCHEMA_VERSION = 1
DIALECT = mariadb.loader("pymysql")()
META_TABLE = "kite_meta"
MESSAGE_TABLE = "kite_msg_{shard}"
TEXT_KWARGS: dict[str, Any] = {  # dialect options: sa.Table's **kw
    "mariadb_engine": "InnoDB",
    "mariadb_default_charset": "utf8mb4",
    "mariadb_collate": "utf8mb4_bin",
}

# Limits the columns impose; entities are checked against them before any batch is built.
MAX_ID = 64
MAX_NAME = 255
MAX_BODY = (1 << 24) - 1


def _message_table(metadata: sa.MetaData, shard: int) -> sa.Table:
    name = sa.String(MAX_NAME)
    flag = sa.Boolean(create_constraint=False)
    return sa.Table(
        MESSAGE_TABLE.format(shard=shard),
        metadata,
        # ascii_bin: byte order, so the id order equals Python's str order for cursors.
        sa.Column(
            "message_id", mysql.VARCHAR(MAX_ID, charset="ascii", collation="ascii_bin"), primary_key=True
        ),
        sa.Column("topic", name, nullable=False),
        sa.Column("message_type", name, nullable=False),
        sa.Column("producer_group", name, nullable=False),
        sa.Column("kind", mysql.TINYINT(unsigned=True), nullable=False),
        sa.Column("expired_time", sa.BigInteger, nullable=False),
        sa.Column("deliver_limit", sa.Integer, nullable=False),
        sa.Column("committed", flag, nullable=False),
        sa.Column("fly", flag, nullable=False),
        sa.Column("properties", mysql.JSON, nullable=False),
        sa.Column("create_time", sa.BigInteger, nullable=False),
        sa.Column("snappy", flag, nullable=False),
        sa.Column("body", mysql.MEDIUMBLOB, nullable=False),
        sa.Column("created_at", mysql.DOUBLE, nullable=False),
        sa.Column("deliver_count", sa.Integer, nullable=False),
        sa.Column("next_deliver_at", mysql.DOUBLE, nullable=False),
        sa.Column("succ_groups", sa.Text, nullable=False),
        sa.Column("fail_groups", sa.Text, nullable=False),
        sa.Column("dead", flag, nullable=False),
        sa.Column("dead_reason", name, nullable=False),
        sa.Column("broker", name, nullable=False),
        sa.Index("idx_due", "broker", "committed", "dead", "next_deliver_at", "message_id"),
        sa.Index("idx_uncommitted", "broker", "committed", "dead", "created_at", "message_id"),
        sa.Index("idx_dead", "dead", "message_id", "dead_reason"),
        sa.Index("idx_backlog", "broker", "dead", "committed", "topic"),
        **TEXT_KWARGS,
    )


@dataclass(frozen=True)
class Schema:
    """The tables of a database created with `shards` message tables."""

    shards: int
    meta: sa.Table
    messages: tuple[sa.Table, ...]

    def ddl(self) -> list[str]:
        """CREATE TABLE IF NOT EXISTS for every table, indexes inline.

        SQLAlchemy emits indexes as separate CREATE INDEX statements; on InnoDB each is a
        DDL of its own (about 3x slower for a fresh database), so they are rendered into
        the table's CREATE statement instead.
        """
        return [_create_table(table) for table in (self.meta, *self.messages)]


def _create_table(table: sa.Table) -> str:
    text = str(CreateTable(table, if_not_exists=True).compile(dialect=DIALECT)).strip()
    columns, closing, options = text.rpartition("\n)")
    indexes = [
        f"\tINDEX {index.name} ({', '.join(str(column.name) for column in index.columns)})"
        for index in sorted(table.indexes, key=lambda index: str(index.name))
    ]
    return ",\n".join([columns, *indexes]) + closing + options


@functools.cache
def schema(shards: int) -> Schema:
    metadata = sa.MetaData()
    meta = sa.Table(
        META_TABLE,
        metadata,
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(255), nullable=False),
        **TEXT_KWARGS,
    )
    return Schema(shards, meta, tuple(_message_table(metadata, shard) for shard in range(shards)))


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    version: int
    shards: int


async def read_schema(conn: Connection, config: MySQLConfig) -> SchemaInfo | None:
    """The recorded version and shard count; None when there is no schema (asyncio side)."""
    async with conn.cursor() as cursor:
        await cursor.execute(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (config.database, META_TABLE),
        )
        (present,) = await cursor.fetchone()
        if not present:
            return None
        await cursor.execute(f"SELECT name, value FROM {META_TABLE}")
        values = dict(await cursor.fetchall())
    if "schema_version" not in values or "shards" not in values:
        return None
    return SchemaInfo(int(values["schema_version"]), int(values["shards"]))


async def verify_schema(conn: Connection, config: MySQLConfig) -> SchemaInfo:
    """Refuse (StoreConfigError) a schema this code cannot use as configured (asyncio side)."""
    info = await read_schema(conn, config)
    if info is None:
        raise StoreConfigError(f"database {config.database!r} has no KiteQ schema: {init_hint(config)}")
    if info.version > SCHEMA_VERSION:
        raise StoreConfigError(
            f"database {config.database!r} has schema version {info.version}, newer than this KiteQ-py "
            f"understands ({SCHEMA_VERSION}): upgrade KiteQ-py"
        )
    if info.shards != config.shards:
        raise StoreConfigError(
            f"database {config.database!r} was created with shards={info.shards}, the store URI says "
            f"shards={config.shards}: messages are placed by shard count, so open it with shards={info.shards}"
        )
    if info.version < SCHEMA_VERSION:
        raise StoreConfigError(
            f"database {config.database!r} has schema version {info.version}, older than {SCHEMA_VERSION}: {init_hint(config)}"
        )
    async with conn.cursor() as cursor:
        names = [table.name for table in schema(info.shards).messages]
        await cursor.execute(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN %s",
            (config.database, names),
        )
        (present,) = await cursor.fetchone()
    if present != len(names):
        raise StoreConfigError(
            f"database {config.database!r} lacks {len(names) - present} message tables: {init_hint(config)}"
        )
    return info


async def create_schema(conn: Connection, config: MySQLConfig) -> SchemaInfo:
    """Create the database and whatever tables are missing; idempotent (asyncio side)."""
    async with conn.cursor() as cursor:
        await cursor.execute(
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (config.database,)
        )
        (exists,) = await cursor.fetchone()
        if not exists:
            await cursor.execute(
                f"CREATE DATABASE IF NOT EXISTS `{config.database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )
        await conn.select_db(config.database)
    info = await read_schema(conn, config)
    if info is not None and (info.shards != config.shards or info.version > SCHEMA_VERSION):
        return await verify_schema(conn, config)
    async with conn.cursor() as cursor:
        for statement in schema(config.shards).ddl():
            await cursor.execute(statement)
        await cursor.execute(
            f"INSERT INTO {META_TABLE} (name, value) VALUES ('shards', %s), ('schema_version', %s) "
            "ON DUPLICATE KEY UPDATE value = IF(name = 'schema_version', VALUES(value), value)",
            (str(config.shards), str(SCHEMA_VERSION)),
        )
    return await verify_schema(conn, config)


async def _run_on_master(
    config: MySQLConfig, fn: Callable[[Connection, MySQLConfig], Awaitable[SchemaInfo]], *, use_database: bool
) -> SchemaInfo:
    """Run `fn(conn, config)` on a one-connection pool to the master, with a loop of its own."""
    bridge = AsyncioBridge(f"schema {config.database}")
    await bridge.open()
    try:
        master = Server("master", config.master, config, bridge, maxsize=1, use_database=use_database)
        await master.open(connect=True)
        try:
            return await master.call(fn, config, timeout=max(config.timeout, 60.0))
        finally:
            await master.close()
    finally:
        await bridge.close()


async def init_schema(uri: str, **options: object) -> None:
    """Create the database and the store's tables if missing (what `kiteq-admin store init` runs).

    Idempotent: running it again changes nothing. Refuses (StoreConfigError) a database
    created with another shard count or by a newer KiteQ-py.
    """
    await _run_on_master(parse_uri(uri, **options), create_schema, use_database=False)


async def check_schema(uri: str, **options: object) -> SchemaInfo:
    """The schema's version and shard count; StoreConfigError if the store could not open it."""
    return await _run_on_master(parse_uri(uri, **options), verify_schema, use_database=True)
