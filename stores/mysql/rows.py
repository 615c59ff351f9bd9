"""MessageEntity <-> row of a `kite_msg_N` table, and the checks a row must pass first.

Saves are grouped into multi-row `INSERT IGNORE` statements (IGNORE is what makes a
duplicate id a per-row "False" instead of failing the whole batch). IGNORE would also
turn an oversized value into a silent truncation, so every entity is checked against
the column limits here, before it joins a batch, and refused with a StoreError.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pymysql.converters import escape_bytes, escape_float, escape_str

from protocol import Cmd
from stores.entity import MessageEntity
from stores.errors import StoreError
from stores.mysql.schema import MAX_BODY, MAX_ID, MAX_NAME, schema

# Column order of `kite_msg_N`, taken from its one definition in schema.py.
COLUMNS = tuple(column.name for column in schema(1).messages[0].columns)
STATE_COLUMNS = tuple(name for name in COLUMNS if name != "body")

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def storable_id(message_id: str) -> bool:
    """Whether the id column can hold `message_id`; an id it cannot hold is never stored."""
    return 0 < len(message_id) <= MAX_ID and message_id.isascii()


def check(entity: MessageEntity, owner: str) -> None:
    """Refuse what the columns cannot hold exactly (see the module docstring)."""
    problems = []
    if not storable_id(entity.message_id):
        problems.append(f"message_id must be 1-{MAX_ID} ASCII characters")
    for name in ("topic", "message_type", "producer_group", "dead_reason"):
        if len(getattr(entity, name)) > MAX_NAME:
            problems.append(f"{name} is longer than {MAX_NAME} characters")
    if len(owner) > MAX_NAME:
        problems.append(f"broker is longer than {MAX_NAME} characters")
    if len(entity.body) > MAX_BODY:
        problems.append(f"body is larger than {MAX_BODY} bytes (MEDIUMBLOB)")
    for name, (low, high) in (
        ("deliver_limit", _INT32),
        ("deliver_count", _INT32),
        ("expired_time", _INT64),
        ("create_time", _INT64),
    ):
        if not low <= getattr(entity, name) <= high:
            problems.append(f"{name} is out of range")
    try:
        texts = [entity.topic, entity.message_type, entity.producer_group, entity.dead_reason, owner]
        for text in [*texts, *entity.properties.keys(), *entity.properties.values()]:
            text.encode("utf-8")
    except UnicodeEncodeError:
        problems.append("a text field is not valid Unicode (lone surrogate)")
    if problems:
        raise StoreError(f"message {entity.message_id!r} cannot be stored: {'; '.join(problems)}")


def groups_json(groups: Sequence[str]) -> str:
    return json.dumps(list(groups), ensure_ascii=False) if groups else "[]"


def values_sql(entity: MessageEntity, owner: str) -> str:
    """The row to insert as an SQL literal `(…)` in COLUMNS order; `owner` fills `broker`.

    Each value is escaped by PyMySQL's own function for its type, as the driver would
    escape a parameter; building the literal here, once, in the saving task keeps the
    batch flush to string joins. Call `check` first.
    """
    values = {
        "message_id": escape_str(entity.message_id),
        "topic": escape_str(entity.topic),
        "message_type": escape_str(entity.message_type),
        "producer_group": escape_str(entity.producer_group),
        "kind": str(int(entity.kind)),
        "expired_time": str(int(entity.expired_time)),
        "deliver_limit": str(int(entity.deliver_limit)),
        "committed": "1" if entity.commit else "0",
        "fly": "1" if entity.fly else "0",
        "properties": escape_str(json.dumps(entity.properties, ensure_ascii=False))
        if entity.properties
        else "'{}'",
        "create_time": str(int(entity.create_time)),
        "snappy": "1" if entity.snappy else "0",
        "body": escape_bytes(bytes(entity.body)),
        "created_at": escape_float(float(entity.created_at)),
        "deliver_count": str(int(entity.deliver_count)),
        "next_deliver_at": escape_float(float(entity.next_deliver_at)),
        "succ_groups": escape_str(groups_json(entity.succ_groups)),
        "fail_groups": escape_str(groups_json(entity.fail_groups)),
        "dead": "1" if entity.dead else "0",
        "dead_reason": escape_str(entity.dead_reason),
        "broker": escape_str(owner),
    }
    return "(" + ",".join([values[name] for name in COLUMNS]) + ")"


def from_row(row: Sequence[object], columns: Sequence[str] = COLUMNS) -> MessageEntity:
    """An entity from a row of `columns`; without a body column the body is b""."""
    value: dict[str, Any] = dict(zip(columns, row, strict=True))
    return MessageEntity(
        message_id=value["message_id"],
        topic=value["topic"],
        message_type=value["message_type"],
        producer_group=value["producer_group"],
        body=bytes(value.get("body", b"")),
        kind=Cmd(value["kind"]),
        expired_time=value["expired_time"],
        deliver_limit=value["deliver_limit"],
        commit=bool(value["committed"]),
        fly=bool(value["fly"]),
        properties=json.loads(value["properties"]),
        create_time=value["create_time"],
        snappy=bool(value["snappy"]),
        created_at=value["created_at"],
        deliver_count=value["deliver_count"],
        next_deliver_at=value["next_deliver_at"],
        succ_groups=tuple(json.loads(value["succ_groups"])),
        fail_groups=tuple(json.loads(value["fail_groups"])),
        dead=bool(value["dead"]),
        dead_reason=value["dead_reason"],
        broker=value["broker"],
    )
