"""The delivery log's line format: what kiteq-reconcile reads."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def reference_line(
    log: DeliveryLog, ts: str, event: str, entity: MessageEntity | None, fields: dict[str, object]
) -> str:
    """The line as a dict and json.dumps make it: what the hand-built lines must equal."""
    record: dict[str, object] = {"ts": ts, "event": event, "source": log.source}
    if entity is not None:
        record.update(
            message_id=entity.message_id,
            topic=entity.topic,
            message_type=entity.message_type,
            producer_group=entity.producer_group,
        )
    if log.broker:
        record["broker"] = log.broker
    record.update((k, round(v, 3) if type(v) is float else v) for k, v in fields.items())
    return json.dumps(record, separators=(",", ":"))


TEXT = st.text(max_size=12)
VALUES = st.one_of(
    TEXT,
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(TEXT, max_size=3),
    st.tuples(TEXT, TEXT),
    st.lists(st.one_of(TEXT, st.integers()), max_size=3),
    st.dictionaries(TEXT, st.integers(), max_size=2),
)
# Any name emit() takes as a keyword (not its own `event` and `entity`), the line's own keys too.
FIELD_NAMES = st.one_of(
    TEXT.filter(lambda name: name not in ("event", "entity")),
    st.sampled_from(["group", "ts", "source", "broker", "message_id", "topic", "latency_ms"]),
)


@settings(max_examples=300, deadline=None)
@given(
    event=TEXT,
    strings=st.lists(TEXT, min_size=4, max_size=4),
    with_entity=st.booleans(),
    broker=TEXT,
    fields=st.dictionaries(FIELD_NAMES, VALUES, max_size=5),
)
def test_lines_are_exactly_what_json_dumps_makes_of_the_record(
    tmp_path_factory: pytest.TempPathFactory,
    event: str,
    strings: list[str],
    with_entity: bool,
    broker: str,
    fields: dict[str, object],
) -> None:
    log = DeliveryLog(tmp_path_factory.mktemp("log") / "delivery.log", "broker")
    log.broker = broker  # the broker sets its address once it listens
    entity = MessageEntity(*strings, b"x") if with_entity else None
    log.emit(event, entity, **fields)
    (line,) = log._lines
    log.close()
    ts = "" if "ts" in fields else json.loads(line)["ts"]  # a field named ts replaces it
    assert "ts" in fields or re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", ts)
    assert line == reference_line(log, ts, event, entity, fields)


def test_timestamps_are_utc_now_to_the_microsecond(tmp_path: Path) -> None:
    log = DeliveryLog(tmp_path / "delivery.log", "producer")
    before = datetime.datetime.now(datetime.UTC)
    log.emit("sent")
    after = datetime.datetime.now(datetime.UTC)
    log.close()
    stamp = datetime.datetime.fromisoformat(json.loads(log.path.read_text())["ts"].replace("Z", "+00:00"))
    assert before <= stamp <= after
