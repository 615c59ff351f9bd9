"""`mysql://user:pass@master:3306/db?replica=host:3306&shards=16` — MariaDB/MySQL, master + replica.

Writes and `get` go to the master; `save` returns once the master committed the row
(saves are grouped into multi-row INSERTs, delivery updates and finishes into batched
statements, one transaction per batch). Scans go to the replica while it is usable
(see router.py). Every row records the broker that owns it: `page_due` and
`page_uncommitted` return only this broker's rows, `adopt()` takes over a dead
broker's. The dead-letter queue is shared by all brokers on the database.

Failures are typed: a master that is down or does not answer within `timeout` makes
calls fail fast with StoreUnavailable; the store stays usable and recovers by itself
when the master returns. asyncio (aiomysql) stays inside this package: see bridge.py.
"""

from __future__ import annotations

import dataclasses
import json
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Container, Iterable
from typing import Any

import structlog
import trio

from stores.base import Cursor, Page, SharedStore, Stage, StoreStats
from stores.entity import MessageEntity
from stores.errors import StoreError, StoreUnavailable
from stores.mysql import queries
from stores.mysql.batcher import Batcher
from stores.mysql.bridge import AsyncioBridge
from stores.mysql.durability import SETTINGS, Weakness, weaknesses
from stores.mysql.pools import Server
from stores.mysql.router import ScanRouter
from stores.mysql.rows import STATE_COLUMNS, check, from_row, groups_json, storable_id, values_sql
from stores.mysql.schema import verify_schema
from stores.mysql.statements import ADOPT_CHUNK, SCAN_ORDER, ShardSql, Sql, Statements, statements
from stores.mysql.uri import MySQLConfig, parse_uri
from stores.waiting import summarize

REPLICA_POOL = 4


class MySQLStore(SharedStore):
    durable = True

    def __init__(self, config: MySQLConfig, uri: str = "") -> None:
        self.uri = uri or config.redacted()
        self.config = config
        # A logger per instance, bound now: picks up the logging config in force when the store is made.
        self._log = structlog.get_logger(__name__).bind(store=config.redacted(), broker=config.broker)
        self._bridge: AsyncioBridge | None = None
        self._master: Server | None = None
        self._replica: Server | None = None
        self._router: ScanRouter | None = None
        self._saves: Batcher[queries.SaveItem, bool] | None = None
        self._updates: Batcher[queries.UpdateItem, bool] | None = None
        self._finishes: Batcher[queries.FinishItem, bool] | None = None
        self._schema_version = 0
        self._weaknesses: list[Weakness] = []
        self._statements: Statements | None = None

    def own_as(self, broker: str) -> None:
        if self._bridge is not None:
            raise StoreError("the owner of a MySQL store is set before it starts")
        if not self.config.broker:
            self.config = dataclasses.replace(self.config, broker=broker)
            self._log = self._log.bind(broker=broker)

    @property
    def owner(self) -> str:
        return self.config.broker

    @classmethod
    def from_uri(cls, uri: str, **options: object) -> MySQLStore:
        """What `open_store` calls; options (e.g. `broker=`) override the URI's query."""
        return cls(parse_uri(uri, **options), uri)

    # -- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Open the pools, refuse a missing/older/mismatched schema, start the batchers."""
        if self._bridge is not None:
            return
        config = self.config
        # Compiling the statements takes a moment once per process: keep it off the loop.
        self._statements = await trio.to_thread.run_sync(statements, config.shards)
        self._bridge = AsyncioBridge(config.redacted())
        try:
            await self._bridge.open()
            self._master = Server("master", config.master, config, self._bridge, maxsize=config.pool_size)
            await self._master.open(connect=True)
            self._schema_version = (await self._master.call(verify_schema, config)).version
            await self._check_durability(self._master)
            if config.replica is not None:
                self._replica = Server(
                    "replica", config.replica, config, self._bridge, maxsize=REPLICA_POOL, use_database=False
                )
                await self._replica.open(connect=False)
            self._router = ScanRouter(self._master, self._replica, config)
            self._start_batchers()
        except BaseException:
            await self.close()
            raise
        self._log.info("mysql.store.started", shards=config.shards, schema_version=self._schema_version)

    async def _check_durability(self, master: Server) -> None:
        """Warn of each master setting under which an acknowledged save can be lost (durability.py)."""
        self._weaknesses = weaknesses(await master.call(queries.server_variables, SETTINGS))
        for weakness in self._weaknesses:
            self._log.warning(
                "mysql.durability_weakened",
                setting=weakness.setting,
                value=weakness.value,
                detail=weakness.advice,
            )

    def _start_batchers(self) -> None:
        config, bridge = self.config, self._bridge
        assert bridge is not None
        helpers = max(1, config.flushers // 2)
        self._saves = self._batcher("save", queries.insert_batch, config.save_batch, config.flushers)
        self._updates = self._batcher("delivery update", queries.update_batch, config.update_batch, helpers)
        self._finishes = self._batcher("finish", queries.finish_batch, config.update_batch, helpers)
        for batcher in self._batchers:
            batcher.start(bridge.start_soon)

    def _batcher(
        self, name: str, batch_fn: Callable[..., Awaitable[list[bool]]], max_items: int, flushers: int
    ) -> Batcher[Any, bool]:
        """A batcher whose flush runs `batch_fn(conn, statements, items)` on the master."""

        async def flush(items: list[Any]) -> list[bool]:
            return await self._on_master().call(batch_fn, self._sql, items)

        return Batcher(name, flush, max_items=max_items, max_bytes=self.config.batch_bytes, flushers=flushers)

    async def close(self) -> None:
        """Write what is queued (bounded by `timeout`), then close pools and loop; idempotent."""
        bridge, self._bridge = self._bridge, None
        if bridge is None:
            return
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self.config.timeout):
                for batcher in self._batchers:
                    await batcher.drain()
            for server in (self._replica, self._master):
                if server is not None:
                    await server.close()
            await bridge.close()
        self._master = self._replica = self._router = None
        self._saves = self._updates = self._finishes = None
        self._log.info("mysql.store.closed")

    # -- writes -----------------------------------------------------------------------

    def shard_of(self, message_id: str) -> int:
        """The message table of an id: crc32 is stable across processes and versions."""
        return zlib.crc32(message_id.encode("utf-8")) % self.config.shards

    async def save(self, entity: MessageEntity) -> bool:
        owner = entity.broker or self.config.broker
        check(entity, owner)
        values = values_sql(entity, owner)
        item = queries.SaveItem(self.shard_of(entity.message_id), entity.message_id, values)
        return await self._submit(self._saves, item, len(values))

    async def update_delivery(
        self,
        message_id: str,
        succ_groups: Iterable[str],
        fail_groups: Iterable[str],
        deliver_count: int,
        next_deliver_at: float,
    ) -> bool:
        if not storable_id(message_id):
            return False
        item = queries.UpdateItem(
            self.shard_of(message_id),
            message_id,
            groups_json(tuple(succ_groups)),
            groups_json(tuple(fail_groups)),
            deliver_count,
            float(next_deliver_at),
        )
        return await self._submit(self._updates, item)

    async def finish(self, message_id: str) -> bool:
        if not storable_id(message_id):
            return False
        return await self._submit(self._finishes, queries.FinishItem(self.shard_of(message_id), message_id))

    async def _submit(self, batcher: Batcher[Any, bool] | None, item: object, size: int = 0) -> bool:
        if batcher is None:
            raise StoreUnavailable("the MySQL store is not started")
        with trio.move_on_after(self.config.timeout):
            return await batcher.submit(item, size)
        raise StoreUnavailable(
            f"MySQL master {self.config.master} did not commit the {batcher.name} within {self.config.timeout:g} s; retry later"
        )

    async def commit(self, message_id: str, due_at: float = 0.0) -> bool:
        return await self._change(message_id, lambda sql: sql.commit, due_at=due_at)

    async def cancel(self, message_id: str) -> bool:
        return await self._change(message_id, lambda sql: sql.cancel)

    async def next_due_at(self, now: float) -> float | None:
        statement = self._sql.scans.next_due
        rows = await self._scans().fetch_all(
            statement.text, statement.args(broker=self.config.broker, now=now)
        )
        found = [float(at) for (at,) in rows if at is not None]
        return min(found, default=None)

    async def rollback(self, message_id: str) -> bool:
        return await self._change(message_id, lambda sql: sql.rollback)

    async def dead_letter(self, message_id: str, reason: str) -> bool:
        return await self._change(message_id, lambda sql: sql.dead_letter, reason=reason)

    async def redrive(self, message_id: str) -> bool:
        """Also makes this broker the owner: the broker that redrives it delivers it."""
        return await self._change(message_id, lambda sql: sql.redrive, broker=self.config.broker)

    async def purge(self, message_id: str) -> bool:
        return await self._change(message_id, lambda sql: sql.purge)

    async def _change(self, message_id: str, pick: Callable[[ShardSql], Sql], **values: object) -> bool:
        if not storable_id(message_id):
            return False
        statement = pick(self._sql.shards[self.shard_of(message_id)])
        matched = await self._on_master().call(
            queries.execute, statement.text, statement.args(id=message_id, **values)
        )
        return matched == 1

    async def owners(self) -> set[str]:
        statement = self._sql.scans.owners
        rows = await self._scans().fetch_all(statement.text, statement.args())
        return {owner for (owner,) in rows}

    async def adopt(self, dead_broker: str) -> int:
        """Take over every row (live, uncommitted or dead) owned by `dead_broker`; how many.

        The broker calls it when the registry says `dead_broker` has been gone longer
        than `adopt_after`; from then on this broker's scans return those messages. Rows move in chunks of ADOPT_CHUNK so no transaction grows
        large; calling it twice (or from two brokers) is harmless: whoever runs first
        takes the rows, the second finds none.
        """
        if dead_broker == self.config.broker:
            self._log.warning("mysql.adopt.self", dead_broker=dead_broker)
            return 0
        total = 0
        for shard in self._sql.shards:
            args = shard.adopt.args(broker=self.config.broker, dead_broker=dead_broker)
            while True:
                moved = await self._on_master().call(queries.execute, shard.adopt.text, args)
                total += moved
                if moved < ADOPT_CHUNK:
                    break
        self._log.info("mysql.adopted", dead_broker=dead_broker, rows=total)
        return total

    # -- reads ------------------------------------------------------------------------

    async def get(self, message_id: str) -> MessageEntity | None:
        if not storable_id(message_id):
            return None
        statement = self._sql.shards[self.shard_of(message_id)].get
        row = await self._on_master().call(queries.fetch_one, statement.text, statement.args(id=message_id))
        return from_row(row) if row is not None else None

    async def page_due(
        self,
        now: float,
        after: Cursor | None,
        limit: int,
        skip: Container[str] = frozenset(),
        parked: Collection[str] = frozenset(),
    ) -> Page:
        return await self._page("due", after, limit, skip, parked, now=float(now))

    async def page_uncommitted(self, older_than: float, after: Cursor | None, limit: int) -> Page:
        return await self._page("uncommitted", after, limit, older_than=float(older_than))

    async def page_dead(self, after: Cursor | None, limit: int) -> Page:
        return await self._page("dead", after, limit)

    async def page_messages(
        self, after: Cursor | None, limit: int, *, topic: str = "", stage: Stage | None = None
    ) -> Page:
        """This broker's rows and every dead letter, by message id (the cursor is the last id)."""
        if limit < 1:
            raise StoreError(f"page limit must be at least 1, got {limit}")
        statement = self._sql.scans.browse[stage.value if stage else ""]
        args = statement.args(broker=self.config.broker, topic=topic, after_id=after or "", limit=limit + 1)
        rows = await self._scans().fetch_all(statement.text, args)
        items = [from_row(row, STATE_COLUMNS) for row in rows[:limit]]
        cursor = items[-1].message_id if len(rows) > limit else None
        return Page(await self._with_bodies(items), cursor)

    async def _page(
        self,
        scan: str,
        after: Cursor | None,
        limit: int,
        skip: Container[str] = frozenset(),
        parked: Collection[str] = frozenset(),
        **values: object,
    ) -> Page:
        """One more row than asked tells whether another page follows; skipped rows get no body."""
        if limit < 1:
            raise StoreError(f"page limit must be at least 1, got {limit}")
        statements = self._sql.scans.pages[scan]
        statement = statements.first
        if after is not None:
            statement = statements.after
            values["after_value"], values["after_id"] = _decode(after, scan)
        args = statement.args(broker=self.config.broker, limit=limit + 1, **values)
        rows = await self._scans().fetch_all(statement.text, args)
        items = [from_row(row, STATE_COLUMNS) for row in rows[:limit]]
        cursor = _encode(scan, items[-1]) if len(rows) > limit else None
        wanted = [e for e in items if e.message_id not in skip and e.topic not in parked]
        return Page(await self._with_bodies(wanted), cursor)

    async def _with_bodies(self, items: list[MessageEntity]) -> list[MessageEntity]:
        """The page's bodies, in one more query: the scans themselves stay on narrow index rows.

        A message finished between the two queries has no body any more and leaves the page.
        """
        if not items:
            return items
        by_shard: dict[int, list[str]] = {}
        for item in items:
            by_shard.setdefault(self.shard_of(item.message_id), []).append(item.message_id)
        parts = [(self._sql.shards[shard].bodies, tuple(ids)) for shard, ids in by_shard.items()]
        text = " UNION ALL ".join(f"({statement.text})" for statement, _ in parts)
        args = [arg for statement, ids in parts for arg in statement.args(ids=ids)]
        bodies = {message_id: bytes(body) for message_id, body in await self._scans().fetch_all(text, args)}
        return [
            dataclasses.replace(item, body=bodies[item.message_id])
            for item in items
            if item.message_id in bodies
        ]

    async def stats(self) -> StoreStats:
        """Live counts are this broker's rows; dead counts cover the shared dead-letter queue."""
        counts = self._sql.scans.counts
        rows = await self._scans().fetch_all(counts.text, counts.args(broker=self.config.broker))
        live: Counter[tuple[bool, str]] = Counter()
        dead: Counter[str] = Counter()
        for what, flag, name, number in rows:
            if what == "live":
                live[(bool(flag), name)] += number
            else:
                dead[name] += number
        backlog = Counter({topic: n for (committed, topic), n in live.items() if committed})
        by_acked = self._sql.scans.waiting
        found = await self._scans().fetch_all(by_acked.text, by_acked.args(broker=self.config.broker))
        waiting = summarize(
            (topic, json.loads(acked), int(n), float(oldest)) for topic, acked, n, oldest in found
        )
        scheduled = self._sql.scans.scheduled
        rows = await self._scans().fetch_all(
            scheduled.text, scheduled.args(broker=self.config.broker, now=time.time())
        )
        by_topic: Counter[str] = Counter()
        by_hour: Counter[int] = Counter()
        for topic, hour, number in rows:
            by_topic[topic] += int(number)
            by_hour[int(hour)] += int(number)
        batchers = {batcher.name: dataclasses.asdict(batcher.stats) for batcher in self._batchers}
        return StoreStats(
            kind="mysql",
            messages=sum(live.values()),
            uncommitted=sum(n for (committed, _), n in live.items() if not committed),
            dead=sum(dead.values()),
            dead_by_reason=dict(dead),
            backlog_by_topic=dict(backlog),
            waiting=waiting,
            scheduled_by_topic=dict(by_topic),
            scheduled_by_hour=dict(by_hour),
            details={
                "broker": self.config.broker,
                "master": str(self.config.master),
                "shards": self.config.shards,
                "schema_version": self._schema_version,
                "durability_weakened": [str(weakness) for weakness in self._weaknesses],
                **self._scans().details(),
                "batches": batchers,
            },
        )

    @property
    def _batchers(self) -> list[Batcher[Any, bool]]:
        return [batcher for batcher in (self._saves, self._updates, self._finishes) if batcher is not None]

    @property
    def _sql(self) -> Statements:
        if self._statements is None:
            raise StoreUnavailable("the MySQL store is not started")
        return self._statements

    def _on_master(self) -> Server:
        if self._master is None:
            raise StoreUnavailable("the MySQL store is not started")
        return self._master

    def _scans(self) -> ScanRouter:
        if self._router is None:
            raise StoreUnavailable("the MySQL store is not started")
        return self._router


def _encode(scan: str, last: MessageEntity) -> Cursor:
    """Opaque to callers: the scan, then the last row's key in index order (repr is exact)."""
    order = SCAN_ORDER[scan]
    value = float(getattr(last, order[0])) if len(order) == 2 else 0.0
    return f"{scan}:{value!r}:{last.message_id}"


def _decode(cursor: Cursor, kind: str) -> tuple[float, str]:
    scan, _, rest = cursor.partition(":")
    value, _, message_id = rest.partition(":")
    try:
        if scan != kind or not message_id:
            raise ValueError(scan)
        return float(value), message_id
    except ValueError:
        raise StoreError(f"cursor {cursor!r} does not belong to a page_{kind} scan") from None


__all__ = ["MySQLStore"]
