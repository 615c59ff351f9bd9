"""The tx-ack back-scan: asks producers about messages left uncommitted too long.

Every `tx_scan_interval` it pages through uncommitted messages older than
`tx_check_after` and sends each a TxACKPacket(status=0) on a live connection of the
producer's group. Every question asked counts (in the message's deliver_count, which
for an uncommitted message counts checks); a message still unresolved after
`tx_check_max` questions goes to the dead-letter queue as `tx-unresolved`. While no
producer of its group is connected nobody is asked, so nothing is counted: the
message waits (`waiting`, in /stats), and the next scan runs as soon as a producer of
that group connects. Questions
are bounded per group by an in-flight limit and a rate, so a backlog of old
transactions cannot flood a producer; what is skipped is asked next scan.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

import structlog
import trio

from kiteq.config import TxConfig
from kiteq.server.clock import WallClock
from kiteq.server.dead_reasons import DeadReason
from kiteq.server.events import Events
from kiteq.server.groups import GroupTable
from kiteq.server.ratelimit import TokenBucket
from kiteq.server.tx.checks import TxCheck
from protocol.logevents import LogEvent
from stores import MessageStore, StoreError
from stores.entity import MessageEntity

log = structlog.get_logger(__name__)

PAGE = 200
MAX_BUCKETS = 4096


class TxBackscan:
    def __init__(
        self, store: MessageStore, groups: GroupTable, config: TxConfig, events: Events, *, clock: WallClock
    ) -> None:
        self.store = store
        self.groups = groups
        self.config = config
        self.events = events
        self.clock = clock
        self.inflight: Counter[str] = Counter()
        # Per producer group, the messages the last scan found with none of its producers connected.
        self.waiting: Counter[str] = Counter()
        self.scans = 0  # completed scans: tests wait on it instead of sleeping
        # Per producer group; the least recently asked is forgotten beyond MAX_BUCKETS.
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._woken = trio.Event()

    def producer_connected(self, group: str) -> None:
        """A connection of `group` authenticated: scan now if its messages wait for one."""
        if self.waiting.get(group):
            self._woken.set()

    async def run(self) -> None:
        while True:
            with trio.move_on_after(self.config.tx_scan_interval):
                await self._woken.wait()
            self._woken = trio.Event()
            try:
                await self.scan()
            except StoreError as exc:
                log.warning("tx.scan_store_error", error=str(exc))

    async def scan(self) -> int:
        """Ask about every old uncommitted message once (within the limits); questions sent."""
        older_than = self.clock() - self.config.tx_check_after
        cursor = None
        asked = 0
        self.waiting.clear()
        while True:
            page = await self.store.page_uncommitted(older_than, cursor, PAGE)
            for entity in page.items:
                asked += await self._check(entity)
            if page.cursor is None:
                self.scans += 1
                return asked
            cursor = page.cursor

    async def _check(self, entity: MessageEntity) -> bool:
        group = entity.producer_group
        if entity.deliver_count >= self.config.tx_check_max:
            if await self.store.dead_letter(entity.message_id, DeadReason.TX_UNRESOLVED):
                self.events.emit(
                    LogEvent.DEAD_LETTERED,
                    entity,
                    reason=DeadReason.TX_UNRESOLVED,
                    attempt=entity.deliver_count,
                )
            return False
        if self.inflight[group] >= self.config.tx_check_inflight:
            return False
        bucket = self._buckets.get(group)
        if bucket is None:
            bucket = self._buckets[group] = TokenBucket(self.config.tx_check_rate, self.config.tx_check_rate)
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(group)
        now = self.clock()
        peer = self.groups.pick(group, now)
        if peer is None:
            self.waiting[group] += 1
            return False
        if not bucket.try_take(now):
            return False
        checks = entity.deliver_count + 1
        await self.store.update_delivery(entity.message_id, (), (), checks, now)
        self.inflight[group] += 1
        peer.ask(TxCheck(entity, self.settled, now), self.config.tx_check_timeout)
        self.events.emit(LogEvent.TX_CHECKED, entity, reason="asked", attempt=checks)
        return True

    def settled(self, check: TxCheck, reason: str) -> None:
        """An answer, a timeout or a lost connection ends a question."""
        group = check.entity.producer_group
        self.inflight[group] -= 1
        if self.inflight[group] <= 0:
            del self.inflight[group]
        if reason:
            self.events.emit(LogEvent.TX_CHECKED, check.entity, reason=reason)
