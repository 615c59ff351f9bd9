"""The delivery log's event names, and who writes each: the contract between the broker,
the clients and `kiteq-reconcile`.

It lives in `protocol/` because the delivery log is a format between processes, as the
wire is, and `protocol` is the one layer the broker, the clients and the Spark job (which
imports nothing else of ours) may all import.
"""

from __future__ import annotations

import enum


class LogEvent(enum.StrEnum):
    """One line's `event`. A StrEnum: it is written, counted and compared as its text."""

    # producer
    SENT = "sent"
    SEND_FAILED = "send_failed"
    # broker
    STORED = "stored"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    DELIVERED = "delivered"
    ACKED = "acked"
    NACKED = "nacked"
    TIMEOUT = "timeout"
    DROPPED = "dropped"
    DEAD_LETTERED = "dead_lettered"
    REDRIVEN = "redriven"
    FINISHED = "finished"
    TX_CHECKED = "tx_checked"
    # a stored message carrying `kiteq.deliverAt` in the future: `deliver_at` (Unix ms) says when
    SCHEDULED = "scheduled"
    # a scheduled message its producer group (or an operator) cancelled: it is never delivered
    CANCELLED = "cancelled"
    # consumer
    RECEIVED = "received"
    PROCESSED = "processed"


PRODUCER_EVENTS = (LogEvent.SENT, LogEvent.SEND_FAILED)
BROKER_EVENTS = (
    LogEvent.STORED,
    LogEvent.COMMITTED,
    LogEvent.ROLLED_BACK,
    LogEvent.DELIVERED,
    LogEvent.ACKED,
    LogEvent.NACKED,
    LogEvent.TIMEOUT,
    LogEvent.DROPPED,
    LogEvent.DEAD_LETTERED,
    LogEvent.REDRIVEN,
    LogEvent.FINISHED,
    LogEvent.TX_CHECKED,
    LogEvent.SCHEDULED,
    LogEvent.CANCELLED,
)
CONSUMER_EVENTS = (LogEvent.RECEIVED, LogEvent.PROCESSED)
# Events about one consumer group of a message: without `group` such a line means nothing.
GROUP_EVENTS = (
    LogEvent.DELIVERED,
    LogEvent.ACKED,
    LogEvent.NACKED,
    LogEvent.TIMEOUT,
    LogEvent.DROPPED,
    LogEvent.RECEIVED,
    LogEvent.PROCESSED,
)
# Events that may name a group (then they concern that group only) or not (the whole message).
MAYBE_GROUP_EVENTS = (LogEvent.DEAD_LETTERED, LogEvent.REDRIVEN)
