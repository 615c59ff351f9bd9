"""Reconciling scheduled and cancelled messages, and routing proven by a delivery alone.

Hand-written logs, each message a case; the newest event is at 1000 s, so with the default
60 s grace a message ready after 940 s is pending. A scheduled message is ready at the
latest of its commit and its `deliver_at`; a cancelled one is expected nowhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from spark_jobs.reconcile import main, reconcile
from tests.integration.reconcile_logs import COUNT_COLUMNS, DeliveryLogs, at, epoch_ms

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.reconcile import Report

pytestmark = pytest.mark.spark

SCHED = {"topic": "sched", "message_type": "remind"}
ROUTE = {"topic": "route", "message_type": "x"}


def schedule_logs() -> DeliveryLogs:
    logs = DeliveryLogs()
    for mid in ("s1", "s2", "s3", "s4", "c1", "c2"):
        logs.store(mid, 100.0, ["sms"], **SCHED)
    # s1 is due after the newest event, s2 inside the grace: both pending though stored 900 s ago.
    logs.broker_event("s1", "scheduled", 100.001, deliver_at=epoch_ms(2000.0), **SCHED)
    logs.broker_event("s2", "scheduled", 100.001, deliver_at=epoch_ms(950.0), **SCHED)
    # s3 was due at 500 s and never delivered: lost.
    logs.broker_event("s3", "scheduled", 100.001, deliver_at=epoch_ms(500.0), **SCHED)
    # s4 (deliver_at written as a string) was delivered on time and acked.
    logs.broker_event("s4", "scheduled", 100.001, deliver_at=str(epoch_ms(200.0)), **SCHED)
    logs.deliver("s4", "sms", 200.01, **SCHED)
    # c1 cancelled before its time: neither lost nor pending. c2 cancelled, then delivered anyway.
    logs.broker_event("c1", "scheduled", 100.001, deliver_at=epoch_ms(2000.0), **SCHED)
    logs.broker_event("c1", "cancelled", 150.0, **SCHED)
    logs.broker_event("c2", "scheduled", 100.001, deliver_at=epoch_ms(300.0), **SCHED)
    logs.broker_event("c2", "cancelled", 150.0, **SCHED)
    logs.deliver("c2", "sms", 300.0, outcome=None, **SCHED)
    # t1: a transaction due at 200 s but committed at 950 s is ready at its commit: pending.
    logs.store("t1", 100.0, None, commit=False, **SCHED)
    logs.broker_event("t1", "scheduled", 100.001, deliver_at=epoch_ms(200.0), **SCHED)
    logs.broker_event("t1", "committed", 950.0, groups=["sms"], **SCHED)
    # A `scheduled` that does not say when is a line missing a field, twice.
    logs.broker_event("s5", "scheduled", 100.0, **SCHED)
    logs.broker_event("s5", "scheduled", 100.0, deliver_at="soon", **SCHED)

    # The broker logged no routing (`groups`) at all: deliveries alone say where the messages went.
    for mid in ("u1", "u2", "u3"):
        logs.store(mid, 10.0, None, **ROUTE)
    logs.deliver("u1", "mail", 10.01, outcome="timeout", answer_after=5.0, **ROUTE)
    logs.deliver("u2", "mail", 10.01, **ROUTE)
    logs.broker_event("u3", "finished", 1000.0, **ROUTE)  # the newest event of all
    return logs


# The counts of every row, in COUNT_COLUMNS order.
EXPECTED = {
    ("route", "x", None): (1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    ("route", "x", "mail"): (2, 2, 2, 0, 2, 2, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0),
    ("sched", "remind", "sms"): (7, 7, 7, 0, 2, 2, 1, 0, 0, 0, 3, 1, 0, 7, 2, 1),
}


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("schedule-logs")
    schedule_logs().write(directory)
    return directory


@pytest.fixture(scope="module")
def report(spark: SparkSession, log_dir: Path) -> Report:
    return reconcile(spark, [log_dir])


def test_every_row_counts_exactly(report: Report) -> None:
    found = {
        (r.topic, r.message_type, r.group): tuple(getattr(r, c) for c in COUNT_COLUMNS)
        for r in report.summary
    }
    assert found == EXPECTED
    assert report.input.problems["missing_field"] == 2
    assert report.input.by_event["scheduled"] == 7 and report.input.by_event["cancelled"] == 2


def test_verdict_and_detail_name_the_late_the_unrouted_and_the_cancelled(report: Report) -> None:
    assert report.verdict == "FAIL: 2 lost, 0 delivered after rollback, 1 delivered after cancel"
    assert report.exit_code == 1
    assert {(row.kind, row.message_id, row.group) for row in report.detail} == {
        ("lost", "s3", "sms"),
        ("lost", "u1", "mail"),
        ("delivered_after_cancel", "c2", "sms"),
    }
    s3 = next(row for row in report.detail if row.message_id == "s3")
    assert (s3.deliver_at, s3.cancelled_at) == (at(500.0), None)
    c2 = next(row for row in report.detail if row.message_id == "c2")
    assert (c2.cancelled_at, c2.first_delivered_at) == (at(150.0), at(300.0))


def test_a_schedule_is_pending_until_its_time_plus_the_grace(spark: SparkSession, log_dir: Path) -> None:
    strict = reconcile(spark, [log_dir], grace_s=0)
    row = strict.row("sched", "remind", "sms")
    # s2 (due 950 s) and t1 (committed 950 s) are now late; s1 (due 2000 s) is still pending.
    assert (row.lost, row.pending) == (3, 1)
    assert {r.message_id for r in strict.detail if r.kind == "lost"} == {"s2", "s3", "t1", "u1"}


def test_schedules_kept_and_a_cancel_honoured_reconcile_clean(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = DeliveryLogs()
    logs.store("a", 0.0, ["sms"], **SCHED)
    logs.broker_event("a", "scheduled", 0.001, deliver_at=epoch_ms(50.0), **SCHED)
    logs.deliver("a", "sms", 50.0, **SCHED)
    logs.store("b", 0.0, ["sms"], **SCHED)
    logs.broker_event("b", "scheduled", 0.001, deliver_at=epoch_ms(500.0), **SCHED)
    logs.broker_event("b", "cancelled", 10.0, **SCHED)
    logs.store("c", 0.0, ["sms"], **SCHED)
    logs.broker_event("c", "scheduled", 0.001, deliver_at=epoch_ms(500.0), **SCHED)
    logs.broker_event("a", "finished", 100.0, **SCHED)
    assert main([str(p) for p in logs.write(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "OK: 3 messages, 1 acked by 1 group, 0 lost, 0 delivered after rollback, 1 pending (younger than the 60 s grace)"
    )
