"""The delivery log: one JSON object per line, the seam to `kiteq-reconcile`.

Written by the broker (`--delivery-log`), and by producers and consumers
(`delivery_log=`). Lines are buffered in memory and appended by `flush()` (the
owner calls it periodically and at close), so logging a message costs one dict and
one `json.dumps`, not a write. When the file passes `max_bytes` it is renamed to
`<path>.1` (older ones shift to `.2`, … up to `backups`) and a new file starts.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import trio

from stores.entity import MessageEntity


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the log's lifetime

    def emit(self, event: str, entity: MessageEntity | None = None, **fields: object) -> None:
        """Record `event`; message fields come from `entity` unless given explicitly."""
        record: dict[str, object] = {"ts": _now_iso(), "event": event, "source": self.source}
        if entity is not None:
            record.update(
                message_id=entity.message_id,
                topic=entity.topic,
                message_type=entity.message_type,
                producer_group=entity.producer_group,
            )
        if self.broker:
            record["broker"] = self.broker
        # Times in milliseconds are written to the microsecond; the broker measures them unrounded.
        record.update((k, round(v, 3) if type(v) is float else v) for k, v in fields.items())
        self._lines.append(json.dumps(record, separators=(",", ":")))

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
