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


# Topics come from clients: past this many distinct ones, the rest are counted together
# under OTHER_TOPICS, so a producer inventing topic names cannot grow the counters.
MAX_COUNTED_TOPICS = 10_000
OTHER_TOPICS = "(other topics)"


class Events:
    def __init__(self, delivery_log: DeliveryLog | None = None) -> None:
        self.delivery_log = delivery_log
        # (event, topic, group) -> count; group is "" for events without one.
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self._topics: set[str] = set()
        self.debug = log.is_enabled_for(logging.DEBUG)
        # event -> the observers subscribed to it: an event nobody observes costs no call.
        self._observers: dict[str, tuple[Observer, ...]] = {}

    @property
    def recorded(self) -> bool:
        """Whether events are written out (delivery log or debug log), so details are worth computing."""
        return self.delivery_log is not None or self.debug

    def subscribe(self, observer: Observer, *events: LogEvent) -> None:
        """Call `observer` on every emit of one of `events`."""
        for event in events:
            self._observers[event] = (*self._observers.get(event, ()), observer)

    def emit(self, event: LogEvent, entity: MessageEntity, **fields: object) -> None:
        key: tuple[str, str, str] = (event, entity.topic, str(fields.get("group", "")))
        counts = self.counts
        if key not in counts:
            key = self._bounded(key)
        counts[key] = counts.get(key, 0) + 1
        if self.delivery_log is not None:
            self.delivery_log.emit(event, entity, **fields)
        observers = self._observers.get(event)
        if observers is not None:
            for observer in observers:
                observer(event, entity, fields)
        if self.debug:
            log.debug(f"message.{event}", message_id=entity.message_id, topic=entity.topic, **fields)

    def _bounded(self, key: tuple[str, str, str]) -> tuple[str, str, str]:
        """A new key: its topic is counted apart only while fewer than MAX_COUNTED_TOPICS are."""
        topic = key[1]
        if topic not in self._topics:
            if len(self._topics) >= MAX_COUNTED_TOPICS:
                return (key[0], OTHER_TOPICS, key[2])
            self._topics.add(topic)
        return key

    def total(self, event: str) -> int:
        return sum(n for (name, _, _), n in self.counts.items() if name == event)
