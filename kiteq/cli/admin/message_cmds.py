"""`kiteq-admin message show|list|cancel`: trace, browse and cancel messages on running brokers.

A message lives on the broker its producer sent it to, so each command asks several
brokers, through their admin endpoints (`GET /messages/{id}`, `GET /messages`), in
this order:

* `--broker URL` given: the one at `--admin`, then each `--broker`;
* else every admin endpoint registered in `--registry` (brokers register theirs),
  after `--admin` when that is given. `--admin` alone, with the default registry,
  asks that one broker only; a default registry that does not exist, or lists no
  endpoint, falls back to `--admin`, while a `--registry` given that lists none is an
  error.

A broker that cannot be reached (killed, its registration not yet expired) is skipped
with a warning on stderr; any other refusal is an error.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import Any

import trio

from kiteq.cli.admin import DEFAULT_ADMIN, DEFAULT_REGISTRY
from kiteq.cli.admin.broker_cmds import AdminError, call
from kiteq.cli.admin.output import emit, print_json
from kiteq.cli.admin.registry_cmds import connect
from kiteq.registry.file import RegistryMissing

EXIT_NOT_FOUND = 1
UNREACHABLE = "cannot reach"  # how `call` begins an AdminError for an endpoint that did not answer
STATES = ("uncommitted", "scheduled", "committed", "dead")  # finished ones are not stored
LIST_COLUMNS = [
    "broker",
    "message_id",
    "topic",
    "message_type",
    "state",
    "deliver_count",
    "acked_groups",
    "body",
]
BODY_CELL = 40


def _brokers(args: argparse.Namespace) -> list[str]:
    """The admin endpoints to ask, in order (the module docstring says which)."""
    if args.broker:
        return list(dict.fromkeys([args.admin, *args.broker]))
    registry_given = args.registry != DEFAULT_REGISTRY
    admin_given = args.admin != DEFAULT_ADMIN
    if admin_given and not registry_given:
        return [args.admin]
    registered = trio.run(_registered, args, registry_given)
    if not registered and registry_given:
        raise AdminError(
            f"no running broker in the registry {args.registry} has registered an admin endpoint "
            "(admin_bind off, or a broker older than this tool?): pass --admin URL"
        )
    first = [args.admin] if admin_given or not registered else []
    return list(dict.fromkeys([*first, *registered]))


async def _registered(args: argparse.Namespace, required: bool) -> list[str]:
    """The registry's admin endpoints, by broker address; none from a missing file unless `required`."""
    try:
        async with connect(args) as registry:
            admins = await registry.list_admins()
    except RegistryMissing:
        if required:
            raise
        return []
    return [admins[address] for address in sorted(admins)]


def _at(args: argparse.Namespace, broker: str) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "admin": broker})


def _skip(exc: AdminError, brokers: list[str], *, missing_ok: bool) -> bool:
    """Whether to go on with the next of `brokers`: this one does not hold the message (404,
    when `missing_ok`) or, being one of several, did not answer (said on stderr)."""
    reason = str(exc)
    if reason.startswith(UNREACHABLE) and len(brokers) > 1:
        print(f"warning: skipped: {reason}", file=sys.stderr)
        return True
    return missing_ok and "(404)" in reason


def show(args: argparse.Namespace) -> int | None:
    """The message from the first broker that knows it (a stored state beats `finished`)."""
    found, misses = [], []
    brokers = _brokers(args)
    for broker in brokers:
        try:
            found.append({"broker": broker, **call(_at(args, broker), "GET", f"/messages/{args.id}")})
        except AdminError as exc:
            if not _skip(exc, brokers, missing_ok=True):
                raise
            misses.append(str(exc))
    if not found:
        print(f"error: {'; '.join(misses)}", file=sys.stderr)
        return EXIT_NOT_FOUND
    message = min(found, key=lambda view: view["state"] == "finished")
    if args.json:
        print_json(message)
        return None
    emit(args, _show_rows(message), columns=["what", "value"])
    return None


def _show_rows(message: dict[str, Any]) -> list[dict[str, Any]]:
    header = message["header"]
    rows: list[dict[str, Any]] = [
        {"what": "message", "value": message["message_id"]},
        {"what": "broker", "value": message["broker"]},
        {"what": "state", "value": message["state"]},
        *({"what": key, "value": value} for key, value in header.items() if key != "created_at"),
    ]
    if "created_at" in header:
        rows.append({"what": "created", "value": _time(header["created_at"])})
    for key, label in (("deliver_count", "deliver count"), ("dead_reason", "dead reason")):
        if message.get(key) is not None:
            rows.append({"what": label, "value": message[key]})
    for key, label in (("next_deliver_at", "next delivery"), ("dead_at", "dead since")):
        if message.get(key) is not None:
            rows.append({"what": label, "value": _time(message[key])})
    for group, row in message["groups"].items():
        said = [name for name in ("routed", "delivered", "acked", "failed") if row[name]]
        if not row["acked"]:
            said.append("waiting")
        rows.append({"what": f"group {group}", "value": ", ".join(said)})
    body = message.get("body")
    if body is not None:
        cut = " (cut)" if body["truncated"] else ""
        rows.append({"what": f"body ({body['bytes']} bytes, {body['encoding']}{cut})", "value": body["text"]})
    for event in message.get("events", ()):
        detail = " ".join(f"{key}={event[key]}" for key in ("group", "attempt", "reason") if key in event)
        rows.append(
            {"what": f"event {event.get('ts', '')}", "value": f"{event.get('event')} {detail}".strip()}
        )
    return rows


def cancel(args: argparse.Namespace) -> int | None:
    """Cancel a scheduled message on the broker that holds it (the others answer 404)."""
    misses: list[str] = []
    brokers = _brokers(args)
    for broker in brokers:
        try:
            call(_at(args, broker), "POST", f"/messages/{args.id}/cancel", json={})
        except AdminError as exc:
            if not _skip(exc, brokers, missing_ok=True):
                print(f"error: {exc}", file=sys.stderr)
                return EXIT_NOT_FOUND
            misses.append(str(exc))
            continue
        if args.json:
            print_json({"cancelled": args.id, "broker": broker})
        else:
            print(f"cancelled {args.id} on {broker}: it will not be delivered")
        return None
    print(f"error: {'; '.join(misses)}", file=sys.stderr)
    return EXIT_NOT_FOUND


def _time(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="milliseconds")


def list_messages(args: argparse.Namespace) -> None:
    params = {"topic": args.topic, "group": args.group, "state": args.state, "limit": str(args.limit)}
    params = {key: value for key, value in params.items() if value}
    rows, cursors = [], {}
    brokers = _brokers(args)
    for broker in brokers:
        try:
            page = call(_at(args, broker), "GET", "/messages", params=params)
        except AdminError as exc:
            if not _skip(exc, brokers, missing_ok=False):
                raise
            continue
        rows += [{"broker": broker, **row} for row in page["messages"]]
        cursors[broker] = page["cursor"]
    if not cursors:
        raise AdminError(f"none of the brokers answered: {', '.join(brokers)}")
    table = [{**row, "body": _cell(row["body"])} for row in rows]
    emit(
        args,
        table,
        data={"messages": rows, "cursors": cursors},
        columns=LIST_COLUMNS,
        empty="no message matches",
    )


def _cell(body: dict[str, Any]) -> str:
    text = body["text"] if body["encoding"] == "text" else f"base64:{body['text']}"
    text = text.replace("\n", " ")
    return text if len(text) <= BODY_CELL else text[: BODY_CELL - 1] + "…"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    message = subparsers.add_parser(
        "message", help="trace and browse messages on running brokers (those in --registry, or --admin)"
    )
    actions = message.add_subparsers(dest="message_command", metavar="ACTION", required=True)
    shown = actions.add_parser("show", help="one message: state, groups, body, delivery-log events")
    shown.add_argument("id", help="the message id (32 hex characters)")
    listed = actions.add_parser("list", help="a page of stored messages with body previews")
    listed.add_argument("--topic")
    listed.add_argument("--group", help="messages routed to this group (or that it acked or failed)")
    listed.add_argument("--state", choices=STATES)
    listed.add_argument("--limit", type=int, default=100, help="at most this many per broker (default 100)")
    cancelled = actions.add_parser("cancel", help="cancel a scheduled message: it is never delivered")
    cancelled.add_argument("id", help="the message id (32 hex characters)")
    for action, func in ((shown, show), (listed, list_messages), (cancelled, cancel)):
        action.add_argument(
            "--broker",
            action="append",
            metavar="URL",
            help="ask --admin and this admin endpoint instead of the registry's brokers (repeatable)",
        )
        action.set_defaults(func=func)
