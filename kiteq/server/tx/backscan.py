"""The tx-ack back-scan: asks producers about messages left uncommitted too long.

Every `tx_scan_interval` it pages through uncommitted messages older than
`tx_check_after` and sends each a TxACKPacket(status=0) on a live connection of the
producer's group. Every question counts (in the message's deliver_count, which for
an uncommitted message counts checks); a message still unresolved after
`tx_check_max` questions goes to the dead-letter queue as `tx-unresolved`. Questions
are bounded per group by an in-flight limit and a rate, so a backlog of old
transactions cannot flood a producer; what is skipped is asked next scan.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import structlog
import trio

from kiteq.config import TxConfig
from kiteq.server.events import Events
from kiteq.server.groups import GroupTable
from kiteq.server.ratelimit import TokenBucket
from protocol import TxStatus
from stores import MessageStore, StoreError
from stores.entity import MessageEntity

log = structlog.get_logger(__name__)

PAGE = 200


@dataclass(eq=False, slots=True)
class TxCheck:
    """One question in flight to a producer connection."""

    entity: MessageEntity
    scan: TxBackscan
    opaque: int = 0
    sent_at: float = field(default_factory=time.time)

    def resolve(self, ok: bool, reason: str = "") -> None:
        self.scan.settled(self, reason)


class TxBackscan:
    def __init__(self, store: MessageStore, groups: GroupTable, config: TxConfig, events: Events) -> None:
        self.store = store
        self.groups = groups
        self.config = config
        self.events = events
        self.inflight: Counter[str] = Counter()
        self._buckets: dict[str, TokenBucket] = {}

    async def run(self) -> None:
        while True:
            await trio.sleep(self.config.tx_scan_interval)
            try:
                await self.scan()
            except StoreError as exc:
                log.warning("tx.scan_store_error", error=str(exc))

    async def scan(self) -> int:
        """Ask about every old uncommitted message once (within the limits); questions sent."""
        older_than = time.time() - self.config.tx_check_after
        cursor = None
        asked = 0
        while True:
            page = await self.store.page_uncommitted(older_than, cursor, PAGE)
            for entity in page.items:
                asked += await self._check(entity)
            if page.cursor is None:
                return asked
            cursor = page.cursor

    async def _check(self, entity: MessageEntity) -> bool:
        group = entity.producer_group
        if entity.deliver_count >= self.config.tx_check_max:
            if await self.store.dead_letter(entity.message_id, "tx-unresolved"):
                self.events.emit(
                    "dead_lettered", entity, reason="tx-unresolved", attempt=entity.deliver_count
                )
            return False
        if self.inflight[group] >= self.config.tx_check_inflight:
            return False
        bucket = self._buckets.get(group)
        if bucket is None:
            bucket = self._buckets[group] = TokenBucket(self.config.tx_check_rate, self.config.tx_check_rate)
        if not bucket.try_take(time.monotonic()):
            return False
        checks = entity.deliver_count + 1
        await self.store.update_delivery(entity.message_id, (), (), checks, time.time())
        peer = self.groups.pick(group, time.time())
        if peer is None:
            self.events.emit("tx_checked", entity, reason="no-producer", attempt=checks)
            return False
        self.inflight[group] += 1
        peer.ask(TxCheck(entity, self), self.config.tx_check_timeout)  # type: ignore[attr-defined]
        self.events.emit("tx_checked", entity, reason="asked", attempt=checks)
        return True

    def settled(self, check: TxCheck, reason: str) -> None:
        """An answer, a timeout or a lost connection ends a question."""
        group = check.entity.producer_group
        self.inflight[group] -= 1
        if self.inflight[group] <= 0:
            del self.inflight[group]
        if reason:
            self.events.emit("tx_checked", check.entity, reason=reason)


def decision_of(status: int) -> TxStatus:
    try:
        return TxStatus(status)
    except ValueError:
        return TxStatus.UNKNOWN
