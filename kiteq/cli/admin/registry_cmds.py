"""Registry commands: `bindings list|add|remove`, `servers`, `producers`, `groups`.

They work on any registry URI (zk:// or file://) through `open_registry`, so what
they show is what brokers and clients see. A registry file that does not exist is an
error (a misspelt path would otherwise read as an empty registry); only
`bindings add --create` makes one. Every binding change is logged as an `audit.*`
event on stderr — what changed, how many, and who changed it from where — whatever
--log-level says.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import logging
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import structlog

from kiteq.cli.admin.output import emit, say
from kiteq.errors import RegistryError
from kiteq.registry import Binding, Registry, open_registry
from kiteq.registry.bindings import DEFAULT_WATERMARK
from kiteq.registry.file import FileRegistry, RegistryMissing
from kiteq.registry.zk import ZooKeeperRegistry

# A person at a shell wants "unreachable" quickly, not after a broker's 10 s.
CLI_CONNECT_TIMEOUT = 5.0


# Audit events are written at info whatever --log-level filters out: a change to what
# brokers deliver must leave a trace. Same processors, so the CLI's log format.
audit_log = structlog.wrap_logger(None, wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))


@contextlib.asynccontextmanager
async def connect(args: argparse.Namespace, *, create: bool = False) -> AsyncIterator[Registry]:
    """The registry of --registry, started; a file registry is made only when `create`."""
    registry = open_registry(args.registry)
    if isinstance(registry, ZooKeeperRegistry) and "connect_timeout=" not in args.registry:
        registry.connect_timeout = CLI_CONNECT_TIMEOUT
    if isinstance(registry, FileRegistry):
        registry.create = create
    try:
        await registry.start()
    except RegistryMissing as exc:
        raise RegistryMissing(f"{exc} with `kiteq-admin bindings add --create ...`") from None
    try:
        yield registry
    finally:
        await registry.close()


def audit(event: str, registry: Registry, count: int, **what: Any) -> None:
    """Log a change made through this CLI: what, how many, and from where (host, user, registry)."""
    audit_log.info(event, **what, count=count, host=socket.gethostname(), user=_user(), registry=registry.uri)


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in the environment and no passwd entry (a bare container)
        return f"uid {os.getuid()}"


def describe(binding: Binding) -> str:
    """`direct pay-succ`, `regex pay-.*`, `fanout`: what a binding selects, for people."""
    kind = binding.bind_type.name.lower()
    return kind if kind == "fanout" else f"{kind} {binding.message_type}"


def binding_row(binding: Binding) -> dict[str, Any]:
    return {
        "group": binding.group,
        "topic": binding.topic,
        "bind": binding.bind_type.name.lower(),
        "message_type": binding.message_type,
        "watermark": binding.watermark,
        "persistent": binding.persistent,
    }


async def bindings_list(args: argparse.Namespace) -> None:
    async with connect(args) as registry:
        found = await registry.list_bindings(args.topic, args.group)
    emit(args, [binding_row(b) for b in found], data=[b.to_json() for b in found], empty="no bindings")


async def bindings_add(args: argparse.Namespace) -> None:
    options = {"group": args.group, "watermark": args.watermark, "persistent": args.persistent}
    if args.direct is not None:
        binding = Binding.direct(args.topic, args.direct, **options)
    elif args.regex is not None:
        binding = Binding.regex(args.topic, args.regex, **options)
    else:
        binding = Binding.fanout(args.topic, **options)
    async with connect(args, create=args.create) as registry:
        await registry.add_binding(binding)
        audit("audit.binding_added", registry, 1, **binding_row(binding))
    say(args, f"bound group {binding.group} to topic {binding.topic}: {describe(binding)}", binding.to_json())


async def bindings_remove(args: argparse.Namespace) -> None:
    async with connect(args) as registry:
        removed = await registry.remove_binding(args.group, args.topic, args.type)
        if removed:
            audit(
                "audit.binding_removed",
                registry,
                removed,
                group=args.group,
                topic=args.topic,
                message_type=args.type,
            )
    what = f"messageType {args.type!r}" if args.type is not None else "any messageType"
    if not removed:
        raise RegistryError(
            f"group {args.group!r} has no binding on topic {args.topic!r} for {what}: nothing removed "
            "(see `kiteq-admin bindings list`)"
        )
    say(
        args,
        f"removed {removed} binding(s) of group {args.group} on topic {args.topic}",
        {"group": args.group, "topic": args.topic, "message_type": args.type, "removed": removed},
    )


async def servers(args: argparse.Namespace) -> None:
    async with connect(args) as registry:
        found = await registry.list_servers(args.topic)
    rows = [
        {"topic": topic, "address": address}
        for topic, addresses in sorted(found.items())
        for address in addresses
    ]
    emit(args, rows, empty="no brokers registered")


async def producers(args: argparse.Namespace) -> None:
    async with connect(args) as registry:
        found = await registry.list_producers()
    rows = [
        {"topic": topic, "group": group, "address": address}
        for topic, groups in sorted(found.items())
        for group, addresses in sorted(groups.items())
        for address in addresses
    ]
    emit(args, rows, empty="no producers registered")


async def groups(args: argparse.Namespace) -> None:
    async with connect(args) as registry:
        found = await registry.list_bindings()
    by_group: dict[tuple[str, str], list[Binding]] = {}
    for binding in found:
        by_group.setdefault((binding.group, binding.topic), []).append(binding)
    keys = sorted(by_group)
    rows = [
        {
            "group": g,
            "topic": t,
            "bindings": [describe(b) for b in by_group[g, t]],
            "watermark": by_group[g, t][0].watermark,
        }
        for g, t in keys
    ]
    data = [{"group": g, "topic": t, "bindings": [b.to_json() for b in by_group[g, t]]} for g, t in keys]
    emit(args, rows, data=data, empty="no consumer groups bound")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bindings = subparsers.add_parser("bindings", help="list, add or remove consumer group bindings")
    actions = bindings.add_subparsers(dest="bindings_command", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="list bindings")
    listing.add_argument("--topic", help="only this topic")
    listing.add_argument("--group", help="only this consumer group")
    listing.set_defaults(func=bindings_list)

    add = actions.add_parser("add", help="bind a consumer group to (part of) a topic")
    add.add_argument("--group", required=True, help="the consumer group")
    add.add_argument("--topic", required=True)
    kind = add.add_mutually_exclusive_group(required=True)
    kind.add_argument("--direct", metavar="TYPE", help="messages of exactly this messageType")
    kind.add_argument(
        "--regex",
        metavar="PATTERN",
        help="messageTypes this regex (RE2 syntax, as Go's regexp) fully matches",
    )
    kind.add_argument("--fanout", action="store_true", help="every message of the topic")
    add.add_argument(
        "--watermark",
        type=int,
        default=DEFAULT_WATERMARK,
        metavar="N",
        help=f"max deliveries in flight to the group (default {DEFAULT_WATERMARK})",
    )
    add.add_argument(
        "--persistent",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep messages while no consumer of the group is online (default: yes)",
    )
    add.add_argument(
        "--create",
        action="store_true",
        help="make the registry file (and its directories) if it does not exist; otherwise that is an error",
    )
    add.set_defaults(func=bindings_add)

    remove = actions.add_parser("remove", help="remove a group's binding(s) on a topic")
    remove.add_argument("--group", required=True)
    remove.add_argument("--topic", required=True)
    remove.add_argument(
        "--type",
        metavar="TYPE",
        help="only the binding with this messageType (pattern); default: all of them",
    )
    remove.set_defaults(func=bindings_remove)

    server_list = subparsers.add_parser("servers", help="brokers registered per topic")
    server_list.add_argument("--topic", help="only this topic")
    server_list.set_defaults(func=servers)

    subparsers.add_parser("producers", help="producers registered per topic and group").set_defaults(
        func=producers
    )
    subparsers.add_parser("groups", help="consumer groups and their bindings per topic").set_defaults(
        func=groups
    )
