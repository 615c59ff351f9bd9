"""Store tools: `store init --store mysql://…` and `store stats|dump|verify --store file:///path/dir`.

`init` creates a MySQL store's database and tables; running it again changes nothing,
and it refuses a database made with another shard count. The file tools open the
directory themselves, so the broker that uses it must be stopped:
while one holds the store's lock they fail with StoreLocked (exit code 2). They
change nothing on disk — a torn tail is reported, not truncated — and a URI with
`?repair=true` lets stats and dump read past damage that would stop a broker.

`dump --json` prints one JSON object per line (JSON Lines), so a store of any size
streams. `verify` exits with 1 when it finds damage a restart would refuse.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from kiteq.cli.admin.output import emit, print_json
from stores import MessageEntity, StoreConfigError
from stores.file import FileStore
from stores.file.verify import Report, verify

DUMP_CHUNK = 500
EXIT_DAMAGED = 1


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    store = subparsers.add_parser(
        "store",
        help="create a MySQL store's schema; offline tools for a file store (stop the broker first)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = store.add_subparsers(dest="store_command", metavar="STORE_COMMAND", required=True)
    for name, func, summary in (
        ("init", store_init, "create a MySQL store's database and tables (idempotent)"),
        ("stats", store_stats, "counts, disk use and recovery figures of the store"),
        ("dump", store_dump, "every message (live and dead) with its state, in id order"),
        ("verify", store_verify, "check every record of every file and read back every message"),
    ):
        command = commands.add_parser(name, help=summary, description=summary)
        command.add_argument("--store", required=True, metavar="URI", help="the store URI")
        command.set_defaults(func=func)
    dump = commands.choices["dump"]
    dump.add_argument("--bodies", action="store_true", help="include bodies (base64 in JSON)")


def _file_store(uri: str, **options: object) -> FileStore:
    if not uri.startswith("file://"):
        raise StoreConfigError(f"{uri!r}: the store tools work on file stores only (file:///path/to/dir)")
    return FileStore.from_uri(uri, **options)


@contextlib.asynccontextmanager
async def open_offline(args: argparse.Namespace) -> AsyncIterator[FileStore]:
    """The store of --store, opened read-only (StoreLocked while a broker has it)."""
    async with _file_store(args.store, read_only=True) as store:
        yield store


def _disk_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.iterdir() if path.is_file())


async def store_init(args: argparse.Namespace) -> None:
    if not args.store.startswith("mysql://"):
        raise StoreConfigError(
            f"{args.store!r}: only mysql:// stores need `store init`; file stores create themselves"
        )
    from stores.mysql import check_schema, init_schema

    await init_schema(args.store)
    info = await check_schema(args.store)
    rows = [{"figure": "schema version", "value": info.version}, {"figure": "shards", "value": info.shards}]
    emit(args, rows, data=dataclasses.asdict(info))


async def store_stats(args: argparse.Namespace) -> None:
    async with open_offline(args) as store:
        stats = await store.stats()
    data = dataclasses.asdict(stats)
    data["details"]["disk_bytes"] = await trio.to_thread.run_sync(_disk_bytes, store.directory)
    rows = [
        {"figure": "messages (live)", "value": stats.messages},
        {"figure": "uncommitted", "value": stats.uncommitted},
        {"figure": "dead letters", "value": stats.dead},
        *({"figure": f"dead: {reason}", "value": n} for reason, n in sorted(stats.dead_by_reason.items())),
        *({"figure": f"backlog: {topic}", "value": n} for topic, n in sorted(stats.backlog_by_topic.items())),
        *({"figure": name, "value": value} for name, value in data["details"].items()),
    ]
    emit(args, rows, data=data)


def _message_json(entity: MessageEntity, bodies: bool) -> dict[str, Any]:
    data = dataclasses.asdict(entity)
    data["kind"] = entity.kind.name
    body = data.pop("body")
    data["body_bytes"] = len(body)
    if bodies:
        data["body_base64"] = base64.b64encode(body).decode()
    return data


def _state(entity: MessageEntity) -> str:
    if entity.dead:
        return f"dead:{entity.dead_reason}"
    return "committed" if entity.commit else "uncommitted"


async def store_dump(args: argparse.Namespace) -> None:
    as_json = args.json
    async with open_offline(args) as store:
        ids = store.message_ids()
        if not as_json:
            print(
                f"{'MESSAGE_ID':32}  {'STATE':16}  {'TOPIC':16}  {'TYPE':16}  {'COUNT':>5}  {'NEXT_AT':>14}  BODY"
            )
        for start in range(0, len(ids), DUMP_CHUNK):
            for entity in await store.get_many(ids[start : start + DUMP_CHUNK]):
                if as_json:
                    print(json.dumps(_message_json(entity, args.bodies), default=str))
                else:
                    body = repr(entity.body[:32]) if args.bodies else f"{len(entity.body)} bytes"
                    print(
                        f"{entity.message_id:32}  {_state(entity):16}  {entity.topic:16}  {entity.message_type:16}  "
                        f"{entity.deliver_count:>5}  {entity.next_deliver_at:>14.3f}  {body}"
                    )
        if not ids and not as_json:
            print("no messages")


async def store_verify(args: argparse.Namespace) -> int | None:
    report: Report = await trio.to_thread.run_sync(verify, _file_store(args.store).directory)
    if args.json:
        print_json({**dataclasses.asdict(report), "damaged": report.damaged})
    else:
        rows = [
            {
                "file": f.name,
                "bytes": f.bytes,
                "records": f.records,
                "torn_tail": f.torn_tail or None,
                "problems": f.problems or None,
            }
            for f in report.files
        ]
        emit(args, rows, empty="no files")
        print(f"{report.messages} messages indexed, {len(report.unreadable)} unreadable")
        for line in report.unreadable:
            print(f"unreadable: {line}")
        print("damaged: restart with ?repair=true or restore a backup" if report.damaged else "ok")
    return EXIT_DAMAGED if report.damaged else None
