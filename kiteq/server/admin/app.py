"""The admin HTTP API as a small ASGI app (no framework: a handful of routes).

GET  /                    the dashboard (static/index.html, polling /stats and /dlq)
GET  /static/<file>       the dashboard's script and style sheet
GET  /healthz             liveness
GET  /stats               JSON snapshot of the broker
GET  /stats/history?since=   the last hour of samples (rates, backlog, latency), oldest first
GET  /metrics             Prometheus text format
GET  /messages/{id}?preview=   one message: header, state, groups, body preview, log events
GET  /messages?topic=&group=&state=&after=&limit=&preview=   a page of summaries and a cursor
GET  /dlq?topic=&group=&reason=&limit=
POST /dlq/redrive         JSON {"message_id"?, "topic"?, "group"?, "reason"?}
POST /dlq/purge           same selection; an empty selection needs {"all": true}
POST /messages/{id}/cancel   cancel a scheduled message (404 unknown, 409 too late or not scheduled)

Mutating routes require `Authorization: Bearer <admin_token>` when a token is set, and
a JSON content type: a page on another origin cannot send that without a CORS
preflight, which this app never grants, so a browser cannot be tricked into purging.
Each mutation is logged as `audit.<action>` with its caller (`audit.py`).
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST

from kiteq.server.admin.audit import Caller, audited
from kiteq.server.admin.browse import Listing, MessageBrowser, MessageNotFound
from kiteq.server.admin.dlq import DeadFilter, DeadLetters
from kiteq.server.admin.messages import (
    LIST_LIMIT,
    LIST_PREVIEW_BYTES,
    MAX_LIST_LIMIT,
    MAX_PREVIEW_BYTES,
    PREVIEW_BYTES,
    State,
    clamp,
)
from kiteq.server.cancel import Cancelled
from kiteq.server.events import Events
from kiteq.server.history import History
from kiteq.server.latency import Latencies
from kiteq.server.metrics import BrokerMetrics
from protocol.schedule import UNKNOWN_MESSAGE

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

STATIC_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
}
# Only plain names of the package's own files: no path can climb out of static/.
STATIC_NAME = re.compile(r"[a-z0-9_-]+\.(html|js|css)")
CANCEL_ROUTE = re.compile(r"/messages/(?P<id>[^/]{1,64})/cancel")


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: bytes = b"application/json"


def json_response(status: int, payload: object) -> Response:
    return Response(status, json.dumps(payload, default=str).encode())


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BrokerView(Protocol):
    """What the admin endpoint reads and changes of a broker, and nothing more."""

    events: Events
    dead_letters: DeadLetters
    messages: MessageBrowser
    latency: Latencies
    history: History

    @property
    def address(self) -> str: ...

    async def stats(self) -> dict[str, Any]: ...

    async def cancel(self, message_id: str) -> Cancelled: ...


class AdminApp:
    def __init__(self, broker: BrokerView, admin_token: str = "") -> None:
        self.broker = broker
        self.admin_token = admin_token
        self.metrics = BrokerMetrics(broker.events, broker.latency)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            response = await self._route(scope, receive)
        except HttpError as exc:
            response = json_response(exc.status, {"error": str(exc)})
        await _respond(send, response)

    async def _route(self, scope: Scope, receive: Receive) -> Response:
        method, path = scope["method"], scope["path"]
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        dead_letters = self.broker.dead_letters
        if method == "GET" and (path == "/" or path.startswith("/static/")):
            return _static(path.removeprefix("/static/") if path != "/" else "index.html")
        if (method, path) == ("GET", "/healthz"):
            return json_response(200, {"status": "ok", "address": self.broker.address})
        if (method, path) == ("GET", "/stats"):
            return json_response(200, await self.broker.stats())
        if (method, path) == ("GET", "/stats/history"):
            since = _float(query["since"], "since") if "since" in query else None
            return json_response(200, self.broker.history.since(since))
        if (method, path) == ("GET", "/metrics"):
            text = self.metrics.render(await self.broker.stats())
            return Response(200, text, CONTENT_TYPE_LATEST.encode())
        if method == "POST" and (found := CANCEL_ROUTE.fullmatch(path)):
            caller = self._authorize(scope)
            await _json_body(scope, receive)  # a JSON content type, as every mutation (see above)
            with audited("cancel", caller, {"message_id": found["id"]}) as tally:
                outcome = await self.broker.cancel(found["id"])
                tally.messages = int(outcome.done)
            if outcome.done:
                return json_response(200, {"cancelled": found["id"]})
            raise HttpError(404 if outcome.why.startswith(UNKNOWN_MESSAGE) else 409, outcome.why)
        if method == "GET" and (path == "/messages" or path.startswith("/messages/")):
            return json_response(200, await self._messages(path.removeprefix("/messages").strip("/"), query))
        if (method, path) == ("GET", "/dlq"):
            limit = _int(query.get("limit", "100"), "limit")
            return json_response(200, await dead_letters.list(_selection(query), limit))
        if method == "POST" and path in ("/dlq/redrive", "/dlq/purge"):
            caller = self._authorize(scope)
            body = await _json_body(scope, receive)
            selection = _selection(body)
            if selection == DeadFilter() and not body.get("all"):
                raise HttpError(400, 'an empty selection applies to every dead letter: send {"all": true}')
            if path == "/dlq/redrive":
                return json_response(200, {"redriven": await dead_letters.redrive(selection, caller)})
            return json_response(200, {"purged": await dead_letters.purge(selection, caller)})
        raise HttpError(404, f"no route {method} {path}")

    async def _messages(self, message_id: str, query: dict[str, str]) -> dict[str, Any]:
        """One message's trace (`message_id` given), else a page of the store (404 / 400 say why)."""
        browser = self.broker.messages
        if message_id:
            preview = clamp(_int(query.get("preview", "0"), "preview"), PREVIEW_BYTES, MAX_PREVIEW_BYTES)
            try:
                return await browser.show(message_id, preview)
            except MessageNotFound as exc:
                raise HttpError(404, str(exc)) from None
        state = query.get("state", "")
        if state and state not in set(State):
            raise HttpError(400, f"state must be one of {', '.join(State)}, not {state!r}")
        listing = Listing(query.get("topic", ""), query.get("group", ""), State(state) if state else None)
        limit = clamp(_int(query.get("limit", "0"), "limit"), LIST_LIMIT, MAX_LIST_LIMIT)
        preview = clamp(_int(query.get("preview", "0"), "preview"), LIST_PREVIEW_BYTES, MAX_PREVIEW_BYTES)
        return await browser.list(listing, query.get("after") or None, limit, preview)

    def _authorize(self, scope: Scope) -> Caller:
        """Who may mutate: anyone when no token is set, else the bearer of the token (for the audit log)."""
        token = self.admin_token
        if not token:
            return Caller.of(scope, token=False)
        headers = dict(scope.get("headers", []))
        given = headers.get(b"authorization", b"").decode()
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HttpError(401, "this route needs Authorization: Bearer <admin_token>")
        return Caller.of(scope, token=True)


def _int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise HttpError(400, f"{name} must be an integer, not {value!r}") from None


def _float(value: str, name: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise HttpError(400, f"{name} must be a number (unix seconds), not {value!r}") from None


def _selection(values: dict[str, Any]) -> DeadFilter:
    return DeadFilter(
        message_id=str(values.get("message_id", "")),
        topic=str(values.get("topic", "")),
        group=str(values.get("group", "")),
        reason=str(values.get("reason", "")),
    )


def _static(name: str) -> Response:
    """A file of the dashboard, from package data (works from a wheel as from the source tree)."""
    if not STATIC_NAME.fullmatch(name):
        raise HttpError(404, f"no static file {name!r}")
    try:
        data = resources.files(__package__).joinpath("static", name).read_bytes()
    except FileNotFoundError:
        raise HttpError(404, f"no static file {name!r}") from None
    return Response(200, data, STATIC_TYPES[name[name.rindex(".") :]])


async def _json_body(scope: Scope, receive: Receive) -> dict[str, Any]:
    content_type = dict(scope.get("headers", [])).get(b"content-type", b"")
    if content_type.split(b";")[0].strip().lower() != b"application/json":
        raise HttpError(415, "send the body as JSON with Content-Type: application/json")
    chunks = []
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            break
    raw = b"".join(chunks)
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise HttpError(400, f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "body must be a JSON object")
    return body


async def _respond(send: Send, response: Response) -> None:
    headers = [
        (b"content-type", response.content_type),
        (b"content-length", str(len(response.body)).encode()),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
