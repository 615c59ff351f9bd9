"""The ledger: one row per (message, consumer group) with what the logs say happened to it.

A message belongs to the groups it was routed to (`groups` of its `stored` / `committed` /
`scheduled` events, and every group it was `delivered` to: a delivery proves the routing)
and to every group some event names (`acked`, `dropped`, …). A message that belongs to no
group (never committed, rolled back, routed nowhere) gets one row with a null group, so its
message-level facts are still counted.

Everything is computed from the events' timestamps, never from the order of lines, so
out-of-order lines, several brokers and interleaved files all give the same answer.
Two aggregations (per message and group, then per message) run over one shuffle: the
events are hash-partitioned by message id once, which satisfies both groupings.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs._events import GROUP_EVENTS, KNOWN_EVENTS, MAYBE_GROUP_EVENTS

KEYS = ("topic", "message_type", "group")
LATENCY_QUANTILES = (0.5, 0.95, 0.99)
SUMMARY_COLUMNS = (
    *KEYS,
    "sent",
    "stored",
    "committed",
    "rolled_back",
    "scheduled",
    "cancelled",
    "delivered",
    "deliveries",
    "acked",
    "duplicates",
    "dropped",
    "dead_lettered",
    "dead_lettered_by_reason",
    "pending",
    "lost",
    "delivered_after_rollback",
    "delivered_after_cancel",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
)
DETAIL_COLUMNS = (
    "kind",
    "message_id",
    *KEYS,
    "producer_group",
    "brokers",
    "sent_at",
    "committed_at",
    "rolled_back_at",
    "deliver_at",
    "cancelled_at",
    "deliveries",
    "first_delivered_at",
    "last_event",
    "last_event_at",
)


@dataclass(frozen=True)
class Filters:
    """Which messages to reconcile: by time first seen (since inclusive, until exclusive), topic, group."""

    since: datetime.datetime | None = None
    until: datetime.datetime | None = None
    topics: Sequence[str] = ()
    groups: Sequence[str] = ()


def _ev(name: str) -> Column:
    return F.col("event") == name


def _first(condition: Column) -> Column:
    return F.min(F.when(condition, F.col("ts")))


def _last(condition: Column) -> Column:
    return F.max(F.when(condition, F.col("ts")))


def ledger(events: DataFrame, filters: Filters, partitions: int) -> DataFrame:
    """One row per (message, group) with the facts the report counts; see the module docstring.

    `partitions` is fixed rather than left to adaptive execution because the result is
    cached, and a cached plan keeps the partitioning it was planned with.
    """
    if filters.topics:
        events = events.where(F.col("topic").isin(*filters.topics))
    messages = _per_message(_per_key(events.repartition(partitions, "message_id")))
    if filters.since is not None:
        messages = messages.where(F.unix_micros("first_seen") >= _micros(filters.since))
    if filters.until is not None:
        messages = messages.where(F.unix_micros("first_seen") < _micros(filters.until))
    return _pairs(messages, filters)


def _per_key(events: DataFrame) -> DataFrame:
    """Aggregate events per (message, group or "" for the message itself) and string attributes.

    The strings (topic, routing, broker, dead-letter reason) are grouping keys rather than
    aggregates, and the event name is aggregated as its number: with only fixed-width
    aggregation buffers Spark runs this, the aggregation over every line, as a generated-code
    hash aggregate. A message's rows that differ only in those strings are merged later.
    """
    group_key = F.when(
        F.col("event").isin(*GROUP_EVENTS, *MAYBE_GROUP_EVENTS), F.coalesce(F.col("group"), F.lit(""))
    ).otherwise(F.lit(""))
    dead = _ev("dead_lettered")
    keyed = events.select(
        "message_id",
        group_key.alias("g"),
        "topic",
        "message_type",
        "producer_group",
        "groups",
        "broker",
        F.when(dead, F.coalesce(F.col("reason"), F.lit("unspecified"))).alias("reason"),
        "event",
        "ts",
        "commit",
        "deliver_at",
        F.array_position(F.array(*map(F.lit, KNOWN_EVENTS)), F.col("event")).alias("code"),
    )
    return keyed.groupBy(
        "message_id", "g", "topic", "message_type", "producer_group", "groups", "broker", "reason"
    ).agg(
        F.min("ts").alias("first_seen"),
        _first(_ev("sent")).alias("sent_at"),
        _first(_ev("stored")).alias("stored_at"),
        _first(_ev("committed") | (_ev("stored") & F.col("commit"))).alias("committed_at"),
        _first(_ev("rolled_back")).alias("rolled_back_at"),
        F.max("deliver_at").alias("deliver_at"),
        _first(_ev("cancelled")).alias("cancelled_at"),
        F.count_if(_ev("delivered")).alias("deliveries"),
        _first(_ev("delivered")).alias("first_delivered_at"),
        _last(_ev("delivered")).alias("last_delivered_at"),
        _first(_ev("acked")).alias("acked_at"),
        F.count_if(_ev("dropped")).alias("drops"),
        _last(dead).alias("dead_at"),
        _last(_ev("redriven")).alias("redriven_at"),
        F.max_by(F.col("code"), F.col("ts")).alias("last_code"),
        F.max("ts").alias("last_at"),
    )


def _per_message(rows: DataFrame) -> DataFrame:
    """One row per message: its own facts, its routing, and its per-group rows as `pairs`."""
    own = F.col("g") == ""

    def earliest(name: str) -> Column:
        return F.min(F.when(own, F.col(name))).alias(name)

    def latest(name: str) -> Column:
        return F.max(F.when(own, F.col(name))).alias(name)

    pair_fields = (
        "deliveries",
        "first_delivered_at",
        "last_delivered_at",
        "acked_at",
        "drops",
        "dead_at",
        "reason",
        "redriven_at",
    )
    return rows.groupBy("message_id").agg(
        F.max("topic").alias("topic"),
        F.max("message_type").alias("message_type"),
        F.max("producer_group").alias("producer_group"),
        F.min("first_seen").alias("first_seen"),
        *map(earliest, ("sent_at", "stored_at", "committed_at", "rolled_back_at", "cancelled_at")),
        *map(latest, ("deliver_at", "dead_at", "redriven_at", "last_at")),
        F.max_by(F.when(own, F.col("reason")), F.when(own, F.col("dead_at"))).alias("dead_reason"),
        F.max_by(F.when(own, F.col("last_code")), F.when(own, F.col("last_at"))).alias("last_code"),
        F.array_compact(F.array_distinct(F.flatten(F.collect_list("groups")))).alias("bound"),
        F.array_sort(F.collect_set("broker")).alias("brokers"),
        F.collect_list(F.when(~own, F.struct("g", *pair_fields, "last_code", "last_at"))).alias("pairs"),
    )


def _micros(moment: datetime.datetime) -> int:
    """Microseconds since the epoch; a naive datetime is taken as UTC, like the logs' times."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return (moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(microseconds=1)


def _merged_pair(pairs: Column, group: Column) -> Column:
    """The facts of `group` from a message's `pairs`, merged over the rows that name it."""
    mine = F.filter(pairs, lambda p: p["g"] == group)

    def total(field: str) -> Column:
        return F.aggregate(mine, F.lit(0).cast("bigint"), lambda acc, p: acc + p[field])

    def least(field: str) -> Column:
        return F.array_min(F.transform(mine, lambda p: p[field]))

    def greatest(*fields: str) -> Column:
        return F.array_max(F.transform(mine, lambda p: F.struct(*(p[f] for f in fields))))

    return F.struct(
        total("deliveries").alias("deliveries"),
        total("drops").alias("drops"),
        least("first_delivered_at").alias("first_delivered_at"),
        F.array_max(F.transform(mine, lambda p: p["last_delivered_at"])).alias("last_delivered_at"),
        least("acked_at").alias("acked_at"),
        greatest("dead_at", "reason").alias("dead"),
        F.array_max(F.transform(mine, lambda p: p["redriven_at"])).alias("redriven_at"),
        greatest("last_at", "last_code").alias("last"),
    )


def _pairs(messages: DataFrame, filters: Filters) -> DataFrame:
    """Explode each message into its (message, group) rows and derive the per-row facts."""
    bound = F.filter(F.col("bound"), lambda g: g != "")
    names = F.array_union(bound, F.array_distinct(F.transform(F.col("pairs"), lambda p: p["g"])))
    if filters.groups:
        names = F.filter(names, lambda g: g.isin(*filters.groups))
    rows = messages.select("*", F.posexplode_outer(names).alias("position", "group")).withColumn(
        "pair", _merged_pair(F.col("pairs"), F.col("group"))
    )
    if filters.groups:
        rows = rows.where(F.col("group").isNotNull())
    pair = F.col("pair")
    dead_at = F.greatest(F.col("dead_at"), pair["dead"]["dead_at"])
    redriven_at = F.greatest(F.col("redriven_at"), pair["redriven_at"])
    pair_dead_later = pair["dead"]["dead_at"].isNotNull() & (
        F.col("dead_at").isNull() | (pair["dead"]["dead_at"] >= F.col("dead_at"))
    )
    acked = pair["acked_at"].isNotNull()
    in_dead_letters = dead_at.isNotNull() & (redriven_at.isNull() | (dead_at > redriven_at))
    dropped = pair["drops"] > 0
    rolled_back = F.col("rolled_back_at").isNotNull()
    cancelled = F.col("cancelled_at").isNotNull()
    deliveries = pair["deliveries"]
    # A delivery to the group proves the message was routed to it, whatever `groups` says.
    routed = F.coalesce(F.array_contains(bound, F.col("group")), F.lit(False)) | (deliveries > 0)
    start = F.coalesce(F.col("sent_at"), F.col("stored_at"))
    pair_later = pair["last"]["last_at"].isNotNull() & (
        F.col("last_at").isNull() | (pair["last"]["last_at"] >= F.col("last_at"))
    )
    last_code = F.when(pair_later, pair["last"]["last_code"]).otherwise(F.col("last_code"))
    return rows.select(
        "message_id",
        "topic",
        "message_type",
        "group",
        "producer_group",
        "brokers",
        (F.coalesce(F.col("position"), F.lit(0)) == 0).alias("first_row_of_message"),
        F.col("sent_at").isNotNull().alias("sent"),
        F.col("stored_at").isNotNull().alias("stored"),
        F.col("committed_at").isNotNull().alias("committed"),
        rolled_back.alias("rolled_back"),
        F.col("deliver_at").isNotNull().alias("scheduled"),
        cancelled.alias("cancelled"),
        deliveries.alias("deliveries"),
        acked.alias("acked"),
        F.when(acked, F.greatest(deliveries - 1, F.lit(0))).otherwise(0).alias("duplicates"),
        (~acked & in_dead_letters).alias("dead_lettered"),
        F.when(pair_dead_later, pair["dead"]["reason"]).otherwise(F.col("dead_reason")).alias("dead_reason"),
        (~acked & ~in_dead_letters & dropped).alias("dropped"),
        (
            (F.col("sent_at").isNotNull() | F.col("stored_at").isNotNull())
            & F.col("committed_at").isNotNull()
            & ~rolled_back
            & ~cancelled
            & routed
            & ~acked
            & ~in_dead_letters
            & ~dropped
        ).alias("open"),
        F.greatest(F.col("committed_at"), redriven_at, F.col("deliver_at")).alias("ready_at"),
        (rolled_back & (deliveries > 0)).alias("delivered_after_rollback"),
        F.coalesce(cancelled & (pair["last_delivered_at"] >= F.col("cancelled_at")), F.lit(False)).alias(
            "delivered_after_cancel"
        ),
        F.when(
            acked & start.isNotNull(), (F.unix_micros(pair["acked_at"]) - F.unix_micros(start)) / 1000.0
        ).alias("latency_ms"),
        "sent_at",
        "committed_at",
        "rolled_back_at",
        "deliver_at",
        "cancelled_at",
        pair["first_delivered_at"].alias("first_delivered_at"),
        F.try_element_at(F.array(*map(F.lit, KNOWN_EVENTS)), last_code.cast("int")).alias("last_event"),
        F.greatest(F.col("last_at"), pair["last"]["last_at"]).alias("last_event_at"),
    )


def summary(pairs: DataFrame, horizon_us: int | None, grace_s: float) -> DataFrame:
    """Counts per (topic, message_type, group), in SUMMARY_COLUMNS order; see docs/reconcile.md."""
    counted = _with_outcome(pairs, horizon_us, grace_s)
    keys = [F.col(k) for k in KEYS]
    base = counted.groupBy(*keys).agg(
        F.count_if("sent").alias("sent"),
        F.count_if("stored").alias("stored"),
        F.count_if("committed").alias("committed"),
        F.count_if("rolled_back").alias("rolled_back"),
        F.count_if("scheduled").alias("scheduled"),
        F.count_if("cancelled").alias("cancelled"),
        F.count_if(F.col("deliveries") > 0).alias("delivered"),
        F.sum("deliveries").alias("deliveries"),
        F.count_if("acked").alias("acked"),
        F.sum("duplicates").alias("duplicates"),
        F.count_if("dropped").alias("dropped"),
        F.count_if("dead_lettered").alias("dead_lettered"),
        F.count_if("pending").alias("pending"),
        F.count_if("lost").alias("lost"),
        F.count_if("delivered_after_rollback").alias("delivered_after_rollback"),
        F.count_if("delivered_after_cancel").alias("delivered_after_cancel"),
        F.percentile_approx("latency_ms", list(LATENCY_QUANTILES)).alias("latency_ms"),
    )
    reasons = (
        counted.where("dead_lettered")
        .groupBy(*keys, "dead_reason")
        .count()
        .groupBy(*keys)
        .agg(F.map_from_entries(F.collect_list(F.struct("dead_reason", "count"))).alias("by_reason"))
    )
    joined = base.join(reasons.alias("r"), [base[k].eqNullSafe(F.col(f"r.{k}")) for k in KEYS], "left")
    no_reasons = F.create_map().cast("map<string,bigint>")
    columns = {name: base[name] for name in base.columns if name != "latency_ms"}
    columns["dead_lettered_by_reason"] = F.coalesce(F.col("r.by_reason"), no_reasons)
    for i, q in enumerate(LATENCY_QUANTILES):
        columns[f"latency_p{round(q * 100)}_ms"] = F.round(base["latency_ms"][i], 3)
    return joined.select(*(columns[name].alias(name) for name in SUMMARY_COLUMNS)).orderBy(
        *(F.col(k).asc_nulls_first() for k in KEYS)
    )


def detail(pairs: DataFrame, horizon_us: int | None, grace_s: float) -> DataFrame:
    """Every lost, delivered-after-rollback and delivered-after-cancel (message, group), in DETAIL_COLUMNS order."""
    kind = (
        F.when(F.col("lost"), F.lit("lost"))
        .when(F.col("delivered_after_rollback"), F.lit("delivered_after_rollback"))
        .when(F.col("delivered_after_cancel"), F.lit("delivered_after_cancel"))
    )
    return (
        _with_outcome(pairs, horizon_us, grace_s)
        .withColumn("kind", kind)
        .where(F.col("kind").isNotNull())
        .select(*DETAIL_COLUMNS)
        .orderBy("kind", *(F.col(k).asc_nulls_first() for k in KEYS), "message_id")
    )


def _with_outcome(pairs: DataFrame, horizon_us: int | None, grace_s: float) -> DataFrame:
    """Split the open rows into lost (ready at or before `horizon - grace`) and pending (younger).

    Ready is the latest of commit, redrive and a schedule's `deliver_at`: a scheduled message
    stays pending until its time plus the grace, however old its commit.
    """
    if horizon_us is None:
        old_enough = F.lit(False)
    else:
        old_enough = F.unix_micros("ready_at") <= F.lit(horizon_us - round(grace_s * 1_000_000))
    return pairs.withColumn("lost", F.col("open") & old_enough).withColumn(
        "pending", F.col("open") & ~old_enough
    )
