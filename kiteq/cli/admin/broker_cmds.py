"""`kiteq-admin stats|top|dlq …`: commands for a running broker, through its admin endpoint."""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
from typing import Any

import httpx

from kiteq.cli.admin.output import emit, format_cell, format_table, say
from kiteq.errors import KiteQError
from kiteq.server.dead_reasons import DeadReason
from kiteq.tls import client_context

TIMEOUT = 10.0
# Home the cursor and clear the screen: a full redraw per frame, no curses needed.
CLEAR_SCREEN = "\x1b[H\x1b[2J"
FAILED_EVENTS = ("nacked", "timeout")
EXIT_NOTHING_MATCHED = 1
TOP_COLUMNS = ["group", "conns", "delivered/s", "acked/s", "failed/s", "inflight", "queued", "backlog"]
BINDING_COLUMNS = [
    "group",
    "topic",
    "message_type",
    "online",
    "persistent",
    "inflight",
    "queued",
    "backlog",
    "oldest",
]


class AdminError(KiteQError):
    """The broker's admin endpoint could not be reached or refused the request."""


def call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    """One request to the admin endpoint; a KiteQError with the broker's reason on failure."""
    headers = {}
    token = args.token or os.environ.get("KITEQ_ADMIN_TOKEN", "")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = args.admin.rstrip("/") + path
    # An https endpoint signed by a private CA is verified against --tls-ca, else the system CAs.
    verify = client_context(args.tls_ca) or True
    try:
        response = httpx.request(method, url, headers=headers, timeout=TIMEOUT, verify=verify, **kwargs)
    except httpx.HTTPError as exc:
        hint = "; pass --tls-ca, the CA that signed it" if _untrusted(exc) else ""
        raise AdminError(f"cannot reach the broker's admin endpoint {args.admin}: {exc}{hint}") from None
    try:
        body = response.json()
    except ValueError:
        body = {"error": response.text}
    if response.status_code >= 400:
        raise AdminError(f"{method} {path} failed ({response.status_code}): {body.get('error', body)}")
    return body


def _untrusted(exc: BaseException) -> bool:
    """The endpoint's certificate failed verification (somewhere in the exception's chain)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def stats(args: argparse.Namespace) -> None:
    data = call(args, "GET", "/stats")
    store, registry, dead = data["store"], data["registry"], data["dead_letters"]
    rows = [
        {"what": "address", "value": data["address"]},
        {"what": "uptime", "value": _duration(data["uptime"])},
        {"what": "connections", "value": data["connections"]["total"]},
        {"what": "registry", "value": f"{registry['uri']} ({registry['state']})"},
        {"what": "stored messages", "value": store["messages"]},
        {"what": "uncommitted", "value": store["uncommitted"]},
        {"what": "dead letters", "value": _with_parts(dead["total"], dead["by_reason"])},
        {
            "what": "scheduled",
            "value": _with_parts(data["scheduled"]["total"], data["scheduled"]["by_topic"]),
        },
    ]
    rows += [
        {"what": f"scheduled for {hour['hour']}", "value": hour["count"]}
        for hour in data["scheduled"]["by_hour"]
    ]
    if data["scheduled"]["later"]:
        rows.append({"what": "scheduled later", "value": data["scheduled"]["later"]})
    rows += [
        {
            "what": f"group {group}",
            "value": f"connections {row['connections']} inflight {row['inflight']} queued {row['queued']} "
            f"backlog {row['backlog']} acked {row['events'].get('acked', 0)}",
        }
        for group, row in data["groups"].items()
    ]
    rows += [
        {
            "what": f"binding {row['group']}/{row['topic']}/{row['message_type']}",
            "value": f"online {format_cell(row['online'])} backlog {row['backlog']} inflight {row['inflight']} "
            f"queued {row['queued']} oldest {row['oldest']}",
        }
        for row in binding_rows(data)
    ]
    rows += [
        {
            "what": f"lane {lane['group']}/{lane['topic']}/{lane['message_type']}",
            "value": f"inflight {lane['inflight']}/{lane['watermark']} queued {lane['queued']}",
        }
        for lane in data["lanes"]
    ]
    emit(args, rows, data=data, columns=["what", "value"])


def _duration(seconds: float) -> str:
    whole = int(seconds)
    hours, minutes = whole // 3600, whole % 3600 // 60
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {whole % 60}s" if minutes else f"{whole}s"


def binding_rows(current: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per group and binding: what it still waits for (a group that went away included)."""
    return [
        {
            "group": group,
            "topic": binding["topic"],
            "message_type": binding["message_type"],
            "online": row["online"],
            "persistent": binding["persistent"],
            "inflight": binding["inflight"],
            "queued": binding["queued"],
            "backlog": binding["backlog"],
            "oldest": "-"
            if binding["oldest_waiting_age"] is None
            else _duration(binding["oldest_waiting_age"]),
        }
        for group, row in current["groups"].items()
        for binding in row.get("bindings", ())
    ]


def _with_parts(total: int, parts: dict[str, int]) -> str:
    return f"{total} ({', '.join(f'{k} {v}' for k, v in sorted(parts.items()))})" if parts else str(total)


def _rate(now: dict[str, int], before: dict[str, int], seconds: float, events: tuple[str, ...]) -> float:
    if seconds <= 0:
        return 0.0
    delta = sum(now.get(event, 0) - before.get(event, 0) for event in events)
    return round(max(0, delta) / seconds, 1)


def top_rows(previous: dict[str, Any], current: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per group: rates are the counters' growth between the two snapshots per second."""
    seconds = current["uptime"] - previous["uptime"]
    rows = []
    for group, row in current["groups"].items():
        before = previous["groups"].get(group, {}).get("events", {})
        rows.append(
            {
                "group": group,
                "conns": row["connections"],
                "delivered/s": _rate(row["events"], before, seconds, ("delivered",)),
                "acked/s": _rate(row["events"], before, seconds, ("acked",)),
                "failed/s": _rate(row["events"], before, seconds, FAILED_EVENTS),
                "inflight": row["inflight"],
                "queued": row["queued"],
                "backlog": row["backlog"],
            }
        )
    return rows


def _top_frame(previous: dict[str, Any], current: dict[str, Any]) -> str:
    seconds = current["uptime"] - previous["uptime"]
    registry = current["registry"]
    header = "  ".join(
        (
            f"kiteq {current['address']}",
            f"up {_duration(current['uptime'])}",
            f"registry {registry['state']}",
            f"connections {current['connections']['total']}",
            f"stored/s {_rate(current['events'], previous['events'], seconds, ('stored',))}",
            f"backlog {sum(current['store']['backlog_by_topic'].values())}",
            f"dead {current['dead_letters']['total']}",
        )
    )
    rows, bindings = top_rows(previous, current), binding_rows(current)
    table = format_table(rows, TOP_COLUMNS) if rows else "no groups connected or bound"
    return header + "\n\n" + table + ("\n\n" + format_table(bindings, BINDING_COLUMNS) if bindings else "")


def top(args: argparse.Namespace) -> None:
    """Redraw per-group rates, in-flight and backlog every --interval seconds."""
    frames = 1 if args.once else args.iterations
    redraw = sys.stdout.isatty() and not args.json
    previous = call(args, "GET", "/stats")
    shown = 0
    while not frames or shown < frames:
        time.sleep(args.interval)
        current = call(args, "GET", "/stats")
        if args.json:
            print(
                json.dumps(
                    {
                        "address": current["address"],
                        "groups": top_rows(previous, current),
                        "bindings": binding_rows(current),
                    }
                ),
                flush=True,
            )
        else:
            print((CLEAR_SCREEN if redraw else "") + _top_frame(previous, current) + "\n", flush=True)
        previous = current
        shown += 1


def _selection(args: argparse.Namespace) -> dict[str, str]:
    chosen = {"message_id": args.id, "topic": args.topic, "group": args.group, "reason": args.reason}
    return {key: value for key, value in chosen.items() if value}


def _described(selection: dict[str, str]) -> str:
    """`--id deadbeef --reason expired`: the filters as given, for messages about them."""
    flags = {"message_id": "id"}
    return " ".join(f"--{flags.get(key, key)} {value}" for key, value in selection.items())


def dlq_list(args: argparse.Namespace) -> None:
    selection = _selection(args)
    rows = call(args, "GET", "/dlq", params={**selection, "limit": str(args.limit)})
    emit(
        args,
        rows,
        columns=["message_id", "topic", "message_type", "reason", "deliver_count", "fail_groups"],
        empty=f"no dead letter matches {_described(selection)}"
        if selection
        else "the dead-letter queue is empty",
    )


def _mutate(args: argparse.Namespace, action: str) -> int | None:
    """Redrive or purge; EXIT_NOTHING_MATCHED when filters were given and matched no dead letter.

    A filter that matches nothing is most likely a typo (a wrong id, topic or group);
    `--all` alone on an empty queue is not a mistake, and exits 0.
    """
    selection = _selection(args)
    if not selection and not args.all:
        raise AdminError(
            f"dlq {action} needs --id, --topic, --group or --reason; or --all for every dead letter"
        )
    body = {**selection, "all": args.all}
    result = call(args, "POST", f"/dlq/{action}", json=body)
    count = result.get("redriven", result.get("purged", 0))
    say(args, f"{action}: {count} message(s)", result)
    if count or not selection:
        return None
    print(
        f"{action}: no dead letter matches {_described(selection)}; nothing changed "
        "(see `kiteq-admin dlq list`)",
        file=sys.stderr,
    )
    return EXIT_NOTHING_MATCHED


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("stats", help="a running broker's state (via --admin)")
    parser.set_defaults(func=stats)
    live = subparsers.add_parser("top", help="a live view of a running broker's groups (via --admin)")
    live.add_argument("--interval", type=_positive, default=1.0, help="seconds between frames (default 1)")
    live.add_argument(
        "--iterations", type=int, default=0, metavar="N", help="stop after N frames (default: never)"
    )
    live.add_argument("--once", action="store_true", help="print one frame and exit")
    live.set_defaults(func=top)
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
        action.add_argument("--reason", choices=[str(reason) for reason in DeadReason])
        if name == "list":
            action.add_argument("--limit", type=int, default=100)
        else:
            action.add_argument("--all", action="store_true", help="every dead letter matching (or all)")
        action.set_defaults(func=func)


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return number
