"""Trace and browse on a running broker: the I/O behind `GET /messages/{id}` and `GET /messages`.

The rules are in messages.py (pure); this class reads the store, the routing table and,
when the broker writes one, the delivery log (in a worker thread, bounded by logtrace).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from kiteq.server.admin import logtrace
from kiteq.server.admin.messages import State, detail, finished, state_of, summary
from kiteq.server.clock import WallClock
from kiteq.server.routing import Router
from stores import MessageEntity, MessageStore

STORE_PAGE = 200
# A filtered list stops after examining this many messages and hands back a cursor, so a
# rare filter costs a bounded walk per request rather than a walk of the whole store.
EXAMINED_PER_LIST = 10_000


class MessageNotFound(LookupError):
    """Neither the store nor the delivery log knows the id; the text says where it looked."""


@dataclass(frozen=True, slots=True)
class Listing:
    """Which messages `GET /messages` lists; empty fields match everything."""

    topic: str = ""
    group: str = ""
    state: State | None = None


class MessageBrowser:
    def __init__(self, store: MessageStore, router: Router, log_path: Path | None, clock: WallClock) -> None:
        self.store = store
        self.router = router
        self.log_path = log_path
        self.clock = clock

    async def show(self, message_id: str, preview_bytes: int) -> dict[str, Any]:
        """A message's header, state, groups, body preview and (log on) events; MessageNotFound."""
        entity = await self.store.get(message_id)
        found = await self._trace(message_id)
        events = found.events if found is not None else []
        if entity is not None:
            routed = self.router.groups(entity.topic, entity.message_type)
            view = detail(entity, routed, self.clock(), preview_bytes, events)
        elif events:
            view = finished(message_id, events)
        else:
            raise MessageNotFound(self._not_found(message_id, found))
        if found is not None:
            view["log"] = {
                "bytes_read": found.bytes_read,
                "complete": found.complete,
                "truncated": found.truncated,
            }
        return view

    async def _trace(self, message_id: str) -> logtrace.Trace | None:
        if self.log_path is None:
            return None
        path = self.log_path
        return await trio.to_thread.run_sync(lambda: logtrace.trace(path, message_id))

    def _not_found(self, message_id: str, found: logtrace.Trace | None) -> str:
        where = f"no message {message_id!r} in the store"
        if found is None:
            return f"{where}, and the delivery log is off: a finished or rolled-back message leaves no trace"
        searched = (
            "the whole delivery log"
            if found.complete
            else f"the last {found.bytes_read} bytes of the delivery log"
        )
        return f"{where} nor in {searched}: wrong id, another broker's, or older than the log"

    async def list(
        self, listing: Listing, after: str | None, limit: int, preview_bytes: int
    ) -> dict[str, Any]:
        """A page of summaries in id order and the cursor to pass as `after` (None: the end)."""
        stage = listing.state.stage if listing.state is not None else None
        if listing.state is State.FINISHED:
            return {"messages": [], "cursor": None}
        rows: list[dict[str, Any]] = []
        examined, cursor = 0, after
        while len(rows) < limit and examined < EXAMINED_PER_LIST:
            page = await self.store.page_messages(cursor, STORE_PAGE, topic=listing.topic, stage=stage)
            now = self.clock()
            for entity in page.items:
                examined += 1
                cursor = entity.message_id
                if self._wanted(entity, listing, now):
                    rows.append(summary(entity, now, preview_bytes))
                    if len(rows) == limit:
                        break
            else:
                if page.cursor is None:
                    return {"messages": rows, "cursor": None}
                cursor = page.cursor
        return {"messages": rows, "cursor": cursor}

    def _wanted(self, entity: MessageEntity, listing: Listing, now: float) -> bool:
        if listing.state is not None and state_of(entity, now) is not listing.state:
            return False
        group = listing.group
        return (
            not group
            or group in entity.succ_groups
            or group in entity.fail_groups
            or group in self.router.groups(entity.topic, entity.message_type)
        )
