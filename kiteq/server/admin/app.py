"""The admin HTTP API as a small ASGI app (no framework: a handful of routes).

GET  /healthz             liveness
GET  /stats               JSON snapshot of the broker
GET  /dlq?topic=&group=&reason=&limit=
POST /dlq/redrive         JSON {"message_id"?, "topic"?, "group"?, "reason"?}
POST /dlq/purge           same selection; an empty selection needs {"all": true}

Mutating routes require `Authorization: Bearer <admin_token>` when a token is set.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from kiteq.server.admin import dlq

if TYPE_CHECKING:
    from kiteq.server.broker import Broker

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AdminApp:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            status, payload = await self._route(scope, receive)
        except HttpError as exc:
            status, payload = exc.status, {"error": str(exc)}
        await _respond(send, status, payload)

    async def _route(self, scope: Scope, receive: Receive) -> tuple[int, object]:
        method, path = scope["method"], scope["path"]
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        store = self.broker.store
        if (method, path) == ("GET", "/healthz"):
            return 200, {"status": "ok", "address": self.broker.address}
        if (method, path) == ("GET", "/stats"):
            return 200, await self.broker.stats()
        if (method, path) == ("GET", "/dlq"):
            limit = int(query.get("limit", "100"))
            return 200, await dlq.list_dead(store, _selection(query), limit)
        if method == "POST" and path in ("/dlq/redrive", "/dlq/purge"):
            self._authorize(scope)
            body = await _json_body(receive)
            selection = _selection(body)
            if selection == dlq.DeadFilter() and not body.get("all"):
                raise HttpError(400, 'an empty selection applies to every dead letter: send {"all": true}')
            if path == "/dlq/redrive":
                count = await dlq.redrive(store, self.broker.dispatcher, self.broker.events, selection)
                return 200, {"redriven": count}
            return 200, {"purged": await dlq.purge(store, selection)}
        raise HttpError(404, f"no route {method} {path}")

    def _authorize(self, scope: Scope) -> None:
        token = self.broker.config.server.admin_token
        if not token:
            return
        headers = dict(scope.get("headers", []))
        given = headers.get(b"authorization", b"").decode()
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HttpError(401, "this route needs Authorization: Bearer <admin_token>")


def _selection(values: dict[str, Any]) -> dlq.DeadFilter:
    return dlq.DeadFilter(
        message_id=str(values.get("message_id", "")),
        topic=str(values.get("topic", "")),
        group=str(values.get("group", "")),
        reason=str(values.get("reason", "")),
    )


async def _json_body(receive: Receive) -> dict[str, Any]:
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


async def _respond(send: Send, status: int, payload: object) -> None:
    data = json.dumps(payload, default=str).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
