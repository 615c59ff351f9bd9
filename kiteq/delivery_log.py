"""The delivery log: one JSON object per line, the seam to `kiteq-reconcile`.

Written by the broker (`--delivery-log`), and by producers and consumers
(`delivery_log=`). Lines are buffered in memory and appended by `flush()` (the
owner calls it periodically and at close), so logging an event costs building one
line, not a write. The broker logs several events per message, so the line is
built by hand: the same bytes as `json.dumps` of the record dict with compact
separators, at under half the cost. When the file passes `max_bytes` it is
renamed to `<path>.1` (older ones shift to `.2`, … up to `backups`) and a new
file starts.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import trio

from protocol.logevents import LogEvent
from stores.entity import MessageEntity

# json's own string encoder (its C version when built): a quoted, escaped, ASCII string.
_quote: Callable[[str], str] = json.encoder.encode_basestring_ascii
_LEADING_KEYS = frozenset(("ts", "event", "source", "broker"))
_MESSAGE_KEYS = ("message_id", "topic", "message_type", "producer_group")


def _json_value(value: object) -> str:
    """`value` as json.dumps writes it; times in milliseconds kept to the microsecond."""
    if type(value) is str:
        return _quote(value)
    if type(value) is int:
        return int.__repr__(value)
    if type(value) is float:
        value = round(value, 3)
        if math.isfinite(value):
            return float.__repr__(value)
    elif type(value) is bool:
        return "true" if value else "false"
    elif isinstance(value, list | tuple) and all(type(item) is str for item in value):
        return f"[{','.join(map(_quote, value))}]"
    return json.dumps(value, separators=(",", ":"))


class _Clock:
    """ISO 8601 UTC with microseconds and a Z, from the wall clock; the seconds part is
    formatted once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def now(self) -> str:
        second, micros = divmod(time.time_ns() // 1000, 1_000_000)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{micros:06d}Z"


class DeliveryLog:
    """Appends delivery events for one process (`source`: producer, broker or consumer)."""

    def __init__(
        self,
        path: str | Path,
        source: str,
        *,
        broker: str = "",
        max_bytes: int = 64 * 1024 * 1024,
        backups: int = 5,
        flush_interval: float = 0.2,
    ) -> None:
        self.path = Path(path)
        self.source = source
        self.broker = broker
        self.max_bytes = max_bytes
        self.backups = backups
        self.flush_interval = flush_interval
        self._lines: list[str] = []
        self._clock = _Clock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the log's lifetime

    def emit(self, event: LogEvent, entity: MessageEntity | None = None, **fields: object) -> None:
        """Record `event`; message fields come from `entity` unless given explicitly.

        A line is the JSON object {ts, event, source, message fields, broker, fields…} in
        that order; a field named like an earlier key replaces its value in place.
        """
        overrides = not _LEADING_KEYS.isdisjoint(fields)
        if entity is not None and not overrides:
            overrides = not fields.keys().isdisjoint(_MESSAGE_KEYS)
        if overrides:
            self._lines.append(self._emit_overriding(event, entity, fields))
            return
        parts = [f'{{"ts":"{self._clock.now()}","event":{_quote(event)},"source":{_quote(self.source)}']
        if entity is not None:
            parts.append(
                f',"message_id":{_quote(entity.message_id)},"topic":{_quote(entity.topic)}'
                f',"message_type":{_quote(entity.message_type)},"producer_group":{_quote(entity.producer_group)}'
            )
        if self.broker:
            parts.append(f',"broker":{_quote(self.broker)}')
        for key, value in fields.items():
            parts.append(f",{_quote(key)}:{_json_value(value)}")
        parts.append("}")
        self._lines.append("".join(parts))

    def _emit_overriding(self, event: str, entity: MessageEntity | None, fields: dict[str, object]) -> str:
        """The rare line where a field replaces one of the leading keys: the encoded values
        are kept in a dict, so a replaced key keeps its place."""
        record = {"ts": _quote(self._clock.now()), "event": _quote(event), "source": _quote(self.source)}
        if entity is not None:
            record.update((key, _quote(getattr(entity, key))) for key in _MESSAGE_KEYS)
        if self.broker:
            record["broker"] = _quote(self.broker)
        record.update((key, _json_value(value)) for key, value in fields.items())
        return "{" + ",".join(f"{_quote(key)}:{value}" for key, value in record.items()) + "}"

    def flush(self) -> None:
        """Append buffered lines to the file and rotate it when it grew past max_bytes."""
        if not self._lines:
            return
        lines, self._lines = self._lines, []
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()
        if self._file.tell() >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        self._file.close()
        for index in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{index + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    async def run(self) -> None:
        """Flush every `flush_interval` until cancelled; flushes once more on the way out."""
        try:
            while True:
                await trio.sleep(self.flush_interval)
                self.flush()
        finally:
            self.flush()

    def close(self) -> None:
        self.flush()
        self._file.close()
