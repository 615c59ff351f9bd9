"""`kiteq-admin stats|dlq …`: commands for a running broker, through its admin endpoint."""

from __future__ import annotations

import argparse
import os
from typing import Any

import httpx

from kiteq.cli.admin.output import emit, say
from kiteq.errors import KiteQError

TIMEOUT = 10.0


class AdminError(KiteQError):
    """The broker's admin endpoint could not be reached or refused the request."""


def call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    """One request to the admin endpoint; a KiteQError with the broker's reason on failure."""
    headers = {}
    token = getattr(args, "token", None) or os.environ.get("KITEQ_ADMIN_TOKEN", "")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = args.admin.rstrip("/") + path
    try:
        response = httpx.request(method, url, headers=headers, timeout=TIMEOUT, **kwargs)
    except httpx.HTTPError as exc:
        raise AdminError(f"cannot reach the broker's admin endpoint {args.admin}: {exc}") from None
    try:
        body = response.json()
    except ValueError:
        body = {"error": response.text}
    if response.status_code >= 400:
        raise AdminError(f"{method} {path} failed ({response.status_code}): {body.get('error', body)}")
    return body


def stats(args: argparse.Namespace) -> None:
    data = call(args, "GET", "/stats")
    store = data["store"]
    rows = [
        {"what": "address", "value": data["address"]},
        {"what": "uptime s", "value": round(data["uptime"], 1)},
        {"what": "connections", "value": data["connections"]},
        {"what": "groups", "value": ", ".join(f"{g}={n}" for g, n in sorted(data["groups"].items()))},
        {
            "what": "registry",
            "value": f"{data['registry']['uri']} ({'up' if data['registry']['connected'] else 'DOWN'})",
        },
        {"what": "stored messages", "value": store["messages"]},
        {"what": "uncommitted", "value": store["uncommitted"]},
        {"what": "dead letters", "value": store["dead"]},
    ]
    rows += [
        {
            "what": f"lane {lane['group']}/{lane['topic']}",
            "value": f"inflight {lane['inflight']}/{lane['watermark']} queued {lane['queued']}",
        }
        for lane in data["lanes"]
    ]
    emit(args, rows, data=data, columns=["what", "value"])


def _selection(args: argparse.Namespace) -> dict[str, str]:
    chosen = {"message_id": args.id, "topic": args.topic, "group": args.group, "reason": args.reason}
    return {key: value for key, value in chosen.items() if value}


def dlq_list(args: argparse.Namespace) -> None:
    params = {**_selection(args), "limit": str(args.limit)}
    rows = call(args, "GET", "/dlq", params=params)
    emit(
        args,
        rows,
        columns=["message_id", "topic", "message_type", "reason", "deliver_count", "fail_groups"],
        empty="the dead-letter queue is empty",
    )


def _mutate(args: argparse.Namespace, action: str) -> None:
    selection = _selection(args)
    if not selection and not args.all:
        raise AdminError(
            f"dlq {action} needs --id, --topic, --group or --reason; or --all for every dead letter"
        )
    body = {**selection, "all": args.all}
    result = call(args, "POST", f"/dlq/{action}", json=body)
    count = result.get("redriven", result.get("purged", 0))
    say(args, f"{action}: {count} message(s)", result)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser("stats", help="a running broker's state (via --admin)")
    parser.set_defaults(func=stats)
    dlq = subparsers.add_parser("dlq", help="a running broker's dead-letter queue (via --admin)")
    actions = dlq.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    for name, func, about in (
        ("list", dlq_list, "list dead letters"),
        ("redrive", lambda a: _mutate(a, "redrive"), "deliver dead letters again"),
        ("purge", lambda a: _mutate(a, "purge"), "delete dead letters for good"),
    ):
        action = actions.add_parser(name, help=about)
        action.add_argument("--id", help="one message id")
        action.add_argument("--topic")
        action.add_argument("--group", help="a consumer group that failed it, or the producer group")
        action.add_argument("--reason", help="expired, deliver-limit, tx-unresolved, no-binding")
        action.add_argument("--token", help="admin token (or env KITEQ_ADMIN_TOKEN)")
        if name == "list":
            action.add_argument("--limit", type=int, default=100)
        else:
            action.add_argument("--all", action="store_true", help="every dead letter matching (or all)")
        action.set_defaults(func=func)
