"""The SQL of every store operation, compiled once per shard count from schema.py.

Statements are built with SQLAlchemy Core against the tables in schema.py and compiled
to text for aiomysql (`%s` placeholders, client-side escaping). Batch statements keep
a fixed shape whatever the batch size: ids go in as one tuple (`IN %s`), delivery
updates as one JSON document joined through `JSON_TABLE`; only the multi-row INSERT
repeats its VALUES group per row.

Scans are one `UNION ALL` over the shard tables: each branch is an index range scan
that stops after `limit` rows, the server merges them. Their keyset cursors follow
the index order: (next_deliver_at, message_id) for due messages, (created_at,
message_id) for uncommitted ones, message_id for dead letters.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement

from protocol.schedule import DELIVER_AT
from stores.mysql.rows import COLUMNS, STATE_COLUMNS
from stores.mysql.schema import DIALECT, schema

ADOPT_CHUNK = 1000
bp = sa.bindparam
# Flags compare as `= 1` / `= 0`: MariaDB range-scans an index on equality, not on `IS TRUE`.
ON: ColumnElement[int] = sa.literal_column("1")
OFF: ColumnElement[int] = sa.literal_column("0")


@dataclass(frozen=True, slots=True)
class Sql:
    """Compiled text plus the order of its positional parameters."""

    text: str
    names: tuple[str, ...]
    defaults: Mapping[str, object]

    def args(self, **values: object) -> tuple[object, ...]:
        return tuple(values[name] if name in values else self.defaults[name] for name in self.names)


def compile_sql(statement: sa.ClauseElement) -> Sql:
    compiled = statement.compile(dialect=DIALECT)
    assert isinstance(compiled, SQLCompiler)  # a statement's compiler, which has positiontup
    names = tuple(compiled.positiontup or ())
    defaults = {name: value for name, value in compiled.params.items() if value is not None}
    return Sql(compiled.string, names, defaults)


@dataclass(frozen=True, slots=True)
class ShardSql:
    """Statements on one `kite_msg_N` table."""

    insert_head: str
    insert_tail: str
    get: Sql
    commit: Sql
    rollback: Sql
    dead_letter: Sql
    redrive: Sql
    purge: Sql
    cancel: Sql
    finish: Sql
    locate: Sql
    bodies: Sql
    update_delivery: str
    adopt: Sql

    def insert(self, rows: Sequence[str]) -> str:
        """`INSERT IGNORE … VALUES (…),(…) RETURNING message_id` for rows given as SQL literals."""
        return self.insert_head + ",".join(rows) + self.insert_tail


def _scheduled(table: sa.Table, *, unrounded: bool) -> ColumnElement[bool]:
    """Rows stored with a kiteq.deliverAt still ahead and no delivery round recorded since
    (`stores.schedule.scheduled_at`; an uncommitted row counts tx checks, not rounds).
    `unrounded`: committed rows only."""
    c = table.c
    path: ColumnElement[str] = sa.literal_column(f"'$.\"{DELIVER_AT}\"'")
    asked = sa.cast(sa.func.json_value(c.properties, path), sa.Numeric(20, 0))
    never_delivered = c.deliver_count == 0 if unrounded else sa.or_(c.committed == OFF, c.deliver_count == 0)
    return sa.and_(never_delivered, asked / 1000 > c.created_at)


def _shard_sql(table: sa.Table) -> ShardSql:
    c = table.c
    by_id = c.message_id == bp("id")
    ids = c.message_id.op("IN")(bp("ids"))
    insert = compile_sql(sa.insert(table).prefix_with("IGNORE").returning(c.message_id)).text
    head, _, rest = insert.partition(" VALUES ")
    _, _, tail = rest.partition(" RETURNING ")
    return ShardSql(
        insert_head=head + " VALUES ",
        insert_tail=" RETURNING " + tail,
        get=compile_sql(sa.select(*(c[name] for name in COLUMNS)).where(by_id)),
        # Order matters: MariaDB assigns left to right, so `committed` is set last.
        commit=compile_sql(
            sa.update(table)
            .where(by_id)
            .ordered_values(
                (c.deliver_count, sa.case((c.committed, c.deliver_count), else_=sa.literal_column("0"))),
                (c.next_deliver_at, sa.case((c.committed, c.next_deliver_at), else_=bp("due_at"))),
                (c.committed, sa.true()),
            )
        ),
        rollback=compile_sql(sa.delete(table).where(by_id, c.committed == OFF)),
        dead_letter=compile_sql(
            sa.update(table).where(by_id).values(dead=sa.true(), dead_reason=bp("reason"))
        ),
        redrive=compile_sql(
            sa.update(table)
            .where(by_id, c.dead == ON)
            .values(
                dead=sa.false(),
                dead_reason="",
                committed=sa.true(),
                deliver_count=0,
                next_deliver_at=0.0,
                fail_groups="[]",
                broker=bp("broker"),
            )
        ),
        purge=compile_sql(sa.delete(table).where(by_id, c.dead == ON)),
        cancel=compile_sql(sa.delete(table).where(by_id, c.dead == OFF, _scheduled(table, unrounded=False))),
        finish=compile_sql(sa.delete(table).where(ids).returning(c.message_id)),
        locate=compile_sql(sa.select(c.message_id).where(ids).with_for_update()),
        bodies=compile_sql(sa.select(c.message_id, c.body).where(ids)),
        update_delivery=(
            f"UPDATE {table.name} AS t JOIN JSON_TABLE(%s, '$[*]' COLUMNS ("
            "id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PATH '$[0]', "
            "succ TEXT PATH '$[1]', fail TEXT PATH '$[2]', "
            "deliver_count INT PATH '$[3]', next_deliver_at DOUBLE PATH '$[4]')) AS v "
            "ON t.message_id = v.id SET t.succ_groups = v.succ, t.fail_groups = v.fail, "
            "t.deliver_count = v.deliver_count, t.next_deliver_at = v.next_deliver_at"
        ),
        adopt=compile_sql(
            sa.update(table)
            .where(c.broker == bp("dead_broker"))
            .values(broker=bp("broker"))
            .with_dialect_options(mariadb_limit=ADOPT_CHUNK)
        ),
    )


def _union(
    tables: tuple[sa.Table, ...],
    columns: Callable[[sa.Table], list[ColumnElement[object]]],
    where: Callable[[sa.Table], ColumnElement[bool]],
    order: tuple[str, ...],
) -> Sql:
    """One page over every shard: per-shard ordered, limited range scans, merged."""
    branches = [
        sa.select(*columns(table))
        .where(where(table))
        .order_by(*(table.c[name] for name in order))
        .limit(bp("limit"))
        for table in tables
    ]
    merged = sa.union_all(*branches).order_by(*(sa.literal_column(name) for name in order)).limit(bp("limit"))
    return compile_sql(merged)


# Each scan's keyset order: its index's columns after the equality prefix. The page
# cursor is the last row's values of these columns.
SCAN_ORDER = {
    "due": ("next_deliver_at", "message_id"),
    "uncommitted": ("created_at", "message_id"),
    "dead": ("message_id",),
}


@dataclass(frozen=True, slots=True)
class Page:
    """A scan's first page, and the pages after a cursor (`after_value`, `after_id`)."""

    first: Sql
    after: Sql


@dataclass(frozen=True, slots=True)
class Scans:
    """Statements over all shards (run on the replica when it is usable)."""

    pages: Mapping[str, Page]
    browse: Mapping[str, Sql]  # by stage ("" for all): page_messages
    counts: Sql
    waiting: Sql
    owners: Sql
    next_due: Sql
    scheduled: Sql


def _after(order: tuple[str, ...], table: sa.Table) -> ColumnElement[bool]:
    """Strictly after the cursor in `order` ((value, message_id) or message_id alone)."""
    message_id = table.c.message_id
    if len(order) == 1:
        return message_id > bp("after_id")
    value = table.c[order[0]]
    return sa.or_(value > bp("after_value"), sa.and_(value == bp("after_value"), message_id > bp("after_id")))


def _scans(tables: tuple[sa.Table, ...]) -> Scans:
    def state(table: sa.Table) -> list[ColumnElement[object]]:
        return [table.c[name] for name in STATE_COLUMNS]

    wanted: dict[str, Callable[[sa.Table], ColumnElement[bool]]] = {
        "due": lambda t: sa.and_(
            t.c.broker == bp("broker"), t.c.committed == ON, t.c.dead == OFF, t.c.next_deliver_at <= bp("now")
        ),
        "uncommitted": lambda t: sa.and_(
            t.c.broker == bp("broker"),
            t.c.committed == OFF,
            t.c.dead == OFF,
            t.c.created_at <= bp("older_than"),
        ),
        "dead": lambda t: t.c.dead == ON,
    }

    def page(where: Callable[[sa.Table], ColumnElement[bool]], order: tuple[str, ...]) -> Page:
        def after(table: sa.Table) -> ColumnElement[bool]:
            return sa.and_(where(table), _after(order, table))

        return Page(_union(tables, state, where, order), _union(tables, state, after, order))

    pages = {scan: page(where, SCAN_ORDER[scan]) for scan, where in wanted.items()}
    # Browsing walks the primary key after the cursor; '' selects every topic.
    stages: dict[str, Callable[[sa.Table], ColumnElement[bool]]] = {
        "": lambda t: sa.or_(t.c.broker == bp("broker"), t.c.dead == ON),
        "uncommitted": lambda t: sa.and_(t.c.broker == bp("broker"), t.c.committed == OFF, t.c.dead == OFF),
        "committed": lambda t: sa.and_(t.c.broker == bp("broker"), t.c.committed == ON, t.c.dead == OFF),
        "dead": lambda t: t.c.dead == ON,
    }

    def browse(stage: Callable[[sa.Table], ColumnElement[bool]]) -> Sql:
        def where(t: sa.Table) -> ColumnElement[bool]:
            any_topic = sa.or_(bp("topic") == sa.literal_column("''"), t.c.topic == bp("topic"))
            return sa.and_(stage(t), any_topic, t.c.message_id > bp("after_id"))

        return _union(tables, state, where, SCAN_ORDER["dead"])

    live = [
        sa.select(
            sa.literal("live").label("what"),
            t.c.committed.label("flag"),
            t.c.topic.label("name"),
            sa.func.count().label("n"),
        )
        .where(t.c.broker == bp("broker"), t.c.dead == OFF)
        .group_by(t.c.committed, t.c.topic)
        for t in tables
    ]
    dead_counts = [
        sa.select(
            sa.literal("dead").label("what"),
            sa.literal(1).label("flag"),
            t.c.dead_reason.label("name"),
            sa.func.count().label("n"),
        )
        .where(t.c.dead == ON)
        .group_by(t.c.dead_reason)
        for t in tables
    ]
    # Per topic and acked groups: what each group still waits for, and since when.
    waiting = [
        sa.select(t.c.topic, t.c.succ_groups, sa.func.count().label("n"), sa.func.min(t.c.created_at))
        .where(t.c.broker == bp("broker"), t.c.dead == OFF, t.c.committed == ON)
        .group_by(t.c.topic, t.c.succ_groups)
        for t in tables
    ]
    # DISTINCT on the leading column of idx_due: a loose index scan per shard.
    owners = sa.union(*(sa.select(t.c.broker).distinct() for t in tables))
    # The first row after `now` in idx_due, per shard.
    next_due = [
        sa.select(sa.func.min(t.c.next_deliver_at).label("at")).where(
            t.c.broker == bp("broker"), t.c.committed == ON, t.c.dead == OFF, t.c.next_deliver_at > bp("now")
        )
        for t in tables
    ]
    # Scheduled rows not yet due are the range of idx_due after `now`: only they are read.
    scheduled = [
        sa.select(
            t.c.topic, (sa.func.floor(t.c.next_deliver_at / 3600) * 3600).label("hour"), sa.func.count()
        )
        .where(
            t.c.broker == bp("broker"),
            t.c.committed == ON,
            t.c.dead == OFF,
            t.c.next_deliver_at > bp("now"),
            _scheduled(t, unrounded=True),
        )
        .group_by(t.c.topic, sa.literal_column("hour"))
        for t in tables
    ]
    return Scans(
        pages,
        {name: browse(stage) for name, stage in stages.items()},
        compile_sql(sa.union_all(*live, *dead_counts)),
        compile_sql(sa.union_all(*waiting)),
        compile_sql(owners),
        compile_sql(sa.union_all(*next_due)),
        compile_sql(sa.union_all(*scheduled)),
    )


@dataclass(frozen=True, slots=True)
class Statements:
    shards: tuple[ShardSql, ...]
    scans: Scans


@functools.cache
def statements(shards: int) -> Statements:
    tables = schema(shards).messages
    return Statements(tuple(_shard_sql(table) for table in tables), _scans(tables))
