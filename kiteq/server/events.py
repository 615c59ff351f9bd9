"""Where the broker reports what happened to a message: counters, delivery log, debug log.

One call site per lifecycle step (`events.emit(LogEvent.ACKED, entity, group=g)`) feeds the
counters (which /stats and /metrics read), the delivery log (when enabled), the
observers (the admin's latency histograms) and structlog at debug level.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import structlog

from kiteq.delivery_log import DeliveryLog
from protocol.logevents import LogEvent
from stores.entity import MessageEntity

log = structlog.get_logger("kiteq.message")

# Called with (event, entity, fields) on every emit, in the broker's Trio thread; it
# runs on the hot path, so it must be cheap and must not raise.
Observer = Callable[[LogEvent, MessageEntity, dict[str, object]], None]


class Events:
    def __init__(self, delivery_log: DeliveryLog | None = None) -> None:
        self.delivery_log = delivery_log
        # (event, topic, group) -> count; group is "" for events without one.
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.debug = log.is_enabled_for(logging.DEBUG)
        self.observers: list[Observer] = []

    @property
    def recorded(self) -> bool:
        """Whether events are written out (delivery log or debug log), so details are worth computing."""
        return self.delivery_log is not None or self.debug

    def emit(self, event: LogEvent, entity: MessageEntity, **fields: object) -> None:
        key = (event, entity.topic, str(fields.get("group", "")))
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.delivery_log is not None:
            self.delivery_log.emit(event, entity, **fields)
        if self.observers:
            for observer in self.observers:
                observer(event, entity, fields)
        if self.debug:
            log.debug(f"message.{event}", message_id=entity.message_id, topic=entity.topic, **fields)

    def total(self, event: str) -> int:
        return sum(n for (name, _, _), n in self.counts.items() if name == event)
