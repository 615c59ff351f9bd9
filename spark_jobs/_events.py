"""Delivery-log lines → typed events, with every line that is not a usable event counted by kind.

Lines are read as text and parsed with `from_json` against a schema of strings, so one odd
field (a number where a string was expected, a list written as a string) costs that field,
never the line, and a line that is not JSON at all costs only itself: it is counted, not
fatal. The counts ride along the first pass over the data as `Observation` metrics instead
of costing a second read.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from protocol import logevents

# Every event of the delivery-log contract (protocol/logevents.py), as plain strings for Spark.
PRODUCER_EVENTS = tuple(event.value for event in logevents.PRODUCER_EVENTS)
BROKER_EVENTS = tuple(event.value for event in logevents.BROKER_EVENTS)
CONSUMER_EVENTS = tuple(event.value for event in logevents.CONSUMER_EVENTS)
KNOWN_EVENTS = PRODUCER_EVENTS + BROKER_EVENTS + CONSUMER_EVENTS
GROUP_EVENTS = tuple(event.value for event in logevents.GROUP_EVENTS)
MAYBE_GROUP_EVENTS = tuple(event.value for event in logevents.MAYBE_GROUP_EVENTS)

# Why a line is not an event, in the order they are checked; reported under these names.
PROBLEMS = ("blank", "not_json", "missing_field", "bad_ts", "unknown_event")
MALFORMED = ("not_json", "missing_field", "bad_ts")

_FIELDS = (
    "ts",
    "event",
    "message_id",
    "topic",
    "message_type",
    "producer_group",
    "group",
    "broker",
    "reason",
)
_CORRUPT = "_corrupt_line"
_LINE_SCHEMA = T.StructType(
    [T.StructField(name, T.StringType()) for name in (*_FIELDS, "commit", "groups", "deliver_at", _CORRUPT)]
)
_GROUPS_SCHEMA = T.ArrayType(T.StringType())
# Events whose `groups` field carries the routing (the consumer groups the message goes to).
ROUTING_EVENTS = ("stored", "committed", "scheduled")
# `deliver_at` is Unix milliseconds; beyond year 9999 it is no time Spark can hold.
_MAX_DELIVER_AT_MS = 253_402_300_799_999

EVENT_COLUMNS = (*_FIELDS, "commit", "groups", "deliver_at")


class LineCounts:
    """The counts of lines by kind, taken while the first action runs through the events.

    When no line gives an event, adaptive execution prunes the observed operator away and
    the observation stays empty; `collect(observed=False)` then counts in a pass of its own.
    """

    def __init__(self, frame: DataFrame) -> None:
        self._metrics = [
            F.count(F.lit(1)).alias("lines"),
            *(F.count_if(F.col("problem") == kind).alias(kind) for kind in PROBLEMS),
            F.unix_micros(F.max(F.when(F.col("problem").isNull(), F.col("ts")))).alias("newest_us"),
            *(
                F.count_if(F.col("problem").isNull() & (F.col("event") == e)).alias(f"event_{e}")
                for e in KNOWN_EVENTS
            ),
        ]
        self._frame = frame
        self._observation = Observation("kiteq-reconcile-input")
        self.observed = frame.observe(self._observation, *self._metrics)

    def collect(self, observed: bool = True) -> tuple[dict[str, int], int | None]:
        """The counts by name, and `newest_us` (None when no line gave an event).

        From the observation if an action ran through `observed` and kept it.
        """
        if observed:
            metrics = self._observation.get
        else:
            row = self._frame.agg(*self._metrics).first()
            metrics = row.asDict() if row is not None else {}
        newest_us = metrics.pop("newest_us")
        return metrics, newest_us


def parse_lines(lines: DataFrame) -> tuple[DataFrame, LineCounts]:
    """Parse a frame of text lines (`value`, as `spark.read.text` gives) into events and line counts."""
    parsed = F.from_json("value", _LINE_SCHEMA, {"columnNameOfCorruptRecord": _CORRUPT, "mode": "PERMISSIVE"})
    fields = lines.select(F.col("value"), parsed.alias("j")).select(
        *(F.nullif(F.trim(F.col(f"j.{name}")), F.lit("")).alias(name) for name in _FIELDS if name != "ts"),
        F.col("j.ts").try_cast(T.TimestampType()).alias("ts"),
        F.col("j.ts").alias("raw_ts"),
        F.lower(F.col("j.commit")).eqNullSafe("true").alias("commit"),
        F.when(F.col("j.event").isin(*ROUTING_EVENTS), F.from_json("j.groups", _GROUPS_SCHEMA)).alias(
            "groups"
        ),
        F.when(F.col("j.event") == "scheduled", _deliver_at(F.col("j.deliver_at"))).alias("deliver_at"),
        (F.trim(F.col("value")) == "").alias("blank"),
        (F.col("j").isNull() | F.col(f"j.{_CORRUPT}").isNotNull()).alias("not_json"),
    )
    # The raw line stops here: only the fields travel on to the observed (materialized) rows.
    counts = LineCounts(fields.select(*EVENT_COLUMNS, _problem().alias("problem")))
    events = counts.observed.where(F.col("problem").isNull()).select(*EVENT_COLUMNS)
    return events, counts


def _problem() -> Column:
    """The first reason a parsed line is not an event, or null for a good one."""
    missing = F.col("event").isNull() | F.col("message_id").isNull() | F.col("raw_ts").isNull()
    missing = missing | (F.col("event").isin(*GROUP_EVENTS) & F.col("group").isNull())
    missing = missing | ((F.col("event") == "scheduled") & F.col("deliver_at").isNull())
    return (
        F.when(F.col("blank"), F.lit("blank"))
        .when(F.col("not_json"), F.lit("not_json"))
        .when(missing, F.lit("missing_field"))
        .when(F.col("ts").isNull(), F.lit("bad_ts"))
        .when(~F.col("event").isin(*KNOWN_EVENTS), F.lit("unknown_event"))
    )


def _deliver_at(millis: Column) -> Column:
    """A `scheduled` event's `deliver_at` (Unix ms, as a number or a string of one) as a time; null if unreadable."""
    ms = millis.try_cast(T.LongType())
    return F.when(ms.between(0, _MAX_DELIVER_AT_MS), F.timestamp_millis(ms))
