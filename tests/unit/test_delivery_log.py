"""The delivery log's line format: what kiteq-reconcile reads."""

from __future__ import annotations

import json
from pathlib import Path

from kiteq.delivery_log import DeliveryLog
from stores import MessageEntity


def test_lines_carry_the_message_and_times_to_the_microsecond(tmp_path: Path) -> None:
    log = DeliveryLog(tmp_path / "delivery.log", "broker", broker="b1:1")
    entity = MessageEntity("ab" * 16, "trade", "pay-succ", "orders", b"x")
    log.emit("acked", entity, group="sms", latency_ms=1.23456789, attempt=2)
    log.flush()
    log.close()
    (line,) = (tmp_path / "delivery.log").read_text().splitlines()
    record = json.loads(line)
    assert record["event"] == "acked" and record["source"] == "broker" and record["broker"] == "b1:1"
    assert record["message_id"] == "ab" * 16 and record["producer_group"] == "orders"
    assert record["group"] == "sms" and record["attempt"] == 2
    assert record["latency_ms"] == 1.235, "the broker measures unrounded; the log keeps microseconds"
