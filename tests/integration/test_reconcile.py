"""The reconciliation job on generated delivery logs whose answers are known line by line.

One set of logs (`known_logs`) holds every case the job must tell apart, each in a
(topic, message_type, group) of its own, spread over three brokers, a producer and
gzip'd consumer logs, with every file's lines shuffled. The newest event is at 1000 s,
so with the default 60 s grace anything ready after 940 s is pending, not lost. Random
histories are checked against a plain-Python model of the same definitions.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from spark_jobs._report import NARROW_DETAIL, NARROW_SUMMARY, DetailRow, SummaryRow
from spark_jobs.reconcile import main, reconcile
from tests.integration.reconcile_logs import BASE, COUNT_COLUMNS, DeliveryLogs, at, model_report, random_logs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.reconcile import Report

pytestmark = pytest.mark.spark

TX = {"topic": "tx", "message_type": "order", "producer_group": "tx-svc"}


def known_logs() -> DeliveryLogs:
    logs = DeliveryLogs()
    # trade/pay-succ → sms, audit: normal flow; sms acks after 10·i ms, audit after 20·i ms.
    for i in range(1, 6):
        t = 10.0 * i
        logs.store(f"n{i}", t, ["sms", "audit"])
        logs.deliver(f"n{i}", "sms", t + 0.003, answer_after=0.01 * i - 0.001)
        logs.deliver(f"n{i}", "audit", t + 0.003, answer_after=0.02 * i - 0.001)
        logs.broker_event(f"n{i}", "finished", t + 0.2)
    # n6: sms acks (60 ms), audit times out and never gets it again: lost for audit only.
    logs.store("n6", 60.0, ["sms", "audit"])
    logs.deliver("n6", "sms", 60.003, answer_after=0.059)
    logs.deliver("n6", "audit", 60.003, outcome="timeout", answer_after=5.0)

    # trade/refund → sms on b2: redeliveries. d1: timeout, ack, and a duplicate after the ack.
    refund = {"message_type": "refund", "broker": "b2"}
    logs.store("d1", 100.0, ["sms"], **refund)
    logs.deliver("d1", "sms", 100.01, outcome="timeout", answer_after=5.0, **refund)
    logs.deliver("d1", "sms", 106.0, attempt=2, answer_after=0.05, **refund)
    logs.deliver("d1", "sms", 107.0, attempt=3, answer_after=0.05, **refund)
    logs.store("d2", 110.0, ["sms"], **refund)
    logs.deliver("d2", "sms", 110.01, outcome="nacked", answer_after=0.01, **refund)
    logs.deliver("d2", "sms", 111.0, attempt=2, answer_after=0.01, **refund)

    # trade/pay-fail → sms on b3: two lost, one pending (inside the grace), one fine.
    fail = {"message_type": "pay-fail", "broker": "b3"}
    logs.store("l1", 200.0, ["sms"], **fail)
    logs.deliver("l1", "sms", 200.01, outcome="timeout", answer_after=5.0, **fail)
    logs.store("l2", 210.0, ["sms"], **fail)
    logs.store("ok1", 220.0, ["sms"], **fail)
    logs.deliver("ok1", "sms", 220.002, answer_after=0.005, **fail)
    logs.store("p1", 980.0, ["sms"], **fail)
    logs.deliver("p1", "sms", 980.01, outcome=None, **fail)

    # trade/expire → sms on b1: dead letters, redrives, a second dead-lettering.
    expire = {"message_type": "expire"}
    logs.store("x1", 300.0, ["sms"], **expire)
    logs.deliver("x1", "sms", 300.01, outcome="nacked", **expire)
    logs.broker_event("x1", "dead_lettered", 310.0, reason="deliver-limit", **expire)
    logs.store("x2", 320.0, ["sms"], **expire)
    logs.broker_event("x2", "dead_lettered", 330.0, reason="expired", **expire)
    logs.store("x3", 340.0, ["sms"], **expire)
    logs.broker_event("x3", "dead_lettered", 345.0, reason="expired", **expire)
    logs.broker_event("x3", "redriven", 400.0, **expire)
    logs.deliver("x3", "sms", 400.1, answer_after=0.1, **expire)
    logs.store("x4", 350.0, ["sms"], **expire)
    logs.broker_event("x4", "dead_lettered", 355.0, reason="deliver-limit", **expire)
    logs.broker_event("x4", "redriven", 410.0, **expire)
    logs.store("x5", 360.0, ["sms"], **expire)
    logs.broker_event("x5", "dead_lettered", 365.0, reason="deliver-limit", group="sms", **expire)
    logs.store("x6", 365.0, ["sms"], **expire)
    logs.broker_event("x6", "dead_lettered", 368.0, reason="expired", **expire)
    logs.broker_event("x6", "redriven", 370.0, **expire)
    logs.broker_event("x6", "dead_lettered", 375.0, reason="expired", **expire)

    # tx/order on b2: two-phase commit; t2 is delivered although rolled back.
    tx = {**TX, "broker": "b2", "producer": "producer-tx.log"}
    logs.store("t1", 500.0, None, commit=False, **tx)
    logs.broker_event("t1", "tx_checked", 510.0, reason="commit", broker="b2", **TX)
    logs.broker_event("t1", "committed", 510.001, groups=["stock"], broker="b2", **TX)
    logs.deliver("t1", "stock", 510.01, answer_after=0.01, broker="b2", **TX)
    logs.store("t2", 520.0, None, commit=False, **tx)
    logs.broker_event("t2", "rolled_back", 521.0, broker="b2", **TX)
    logs.deliver("t2", "stock", 522.0, outcome=None, broker="b2", **TX)
    logs.store("t3", 530.0, None, commit=False, **tx)
    logs.broker_event("t3", "rolled_back", 531.0, broker="b2", **TX)
    logs.store("t4", 540.0, None, commit=False, **tx)
    for k in range(3):
        logs.broker_event("t4", "tx_checked", 550.0 + 5 * k, reason="unknown", broker="b2", **TX)
    logs.broker_event("t4", "dead_lettered", 565.0, reason="tx-unresolved", broker="b2", **TX)
    logs.store("t5", 900.0, None, commit=False, **tx)
    logs.line("producer-tx.log", "send_failed", "t6", 600.0, reason="store timeout", source="producer", **TX)

    # news/flash → push (non-persistent) on b3: one dropped while push was offline.
    news = {"topic": "news", "message_type": "flash", "broker": "b3"}
    logs.store("f1", 600.0, ["push"], **news)
    logs.broker_event("f1", "dropped", 600.01, group="push", **news)
    logs.store("f2", 610.0, ["push"], **news)
    logs.deliver("f2", "push", 610.003, answer_after=0.001, **news)

    # trade/resend → sms: r1 stored on b1 and again on b2 (a resend), both deliver it.
    resend = {"message_type": "resend"}
    logs.store("r1", 700.0, ["sms"], **resend)
    logs.line("b2.log", "stored", "r1", 700.5, commit=True, groups=["sms"], broker="10.0.0.2:13800", **resend)
    logs.deliver("r1", "sms", 700.01, answer_after=0.01, **resend)
    logs.deliver("r1", "sms", 700.51, answer_after=0.01, broker="b2", **resend)
    logs.store("r2", 710.0, ["sms"], broker="b3", **resend)
    logs.deliver("r2", "sms", 710.001, answer_after=0.005, broker="b3", **resend)

    # The newest event of all: 1000 s.
    logs.broker_event("n5", "finished", 1000.0)

    # Malformed and foreign lines, spread over the files.
    logs.raw("b1.log", "this is not json")
    logs.raw("b2.log", '{"ts": "2026-11-21T10:00:00Z", "event": "acked"')
    logs.raw("b3.log", '{"ts": "2026-11-21T10:00:00Z", "event": "acked", "topic": "trade"}')
    logs.raw("b1.log", '{"ts": "2026-11-21T10:00:00Z", "event": "acked", "message_id": "n1"}')
    logs.raw("producer.log", '{"ts": "yesterday", "event": "sent", "message_id": "n1"}')
    logs.raw("producer.log", '{"ts": "2026-11-21T10:00:00Z", "event": "connected", "message_id": "-"}')
    logs.raw("b2.log", "")
    logs.raw("b3.log", "   ")
    return logs


# Every row of the summary of `known_logs` (default 60 s grace), in report order: the counts
# in COUNT_COLUMNS order, dead_lettered_by_reason, and latency p50/p95/p99 in ms.
EXPECTED = {
    ("news", "flash", "push"): ((2, 2, 2, 0, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0), {}, (2.0, 2.0, 2.0)),
    ("trade", "expire", "sms"): (
        (6, 6, 6, 0, 2, 2, 1, 0, 0, 4, 0, 1, 0, 0, 0, 0),
        {"deliver-limit": 2, "expired": 2},
        (60198.0, 60198.0, 60198.0),
    ),
    ("trade", "pay-fail", "sms"): ((4, 4, 4, 0, 3, 3, 1, 0, 0, 0, 1, 2, 0, 0, 0, 0), {}, (5.0, 5.0, 5.0)),
    ("trade", "pay-succ", "audit"): (
        (6, 6, 6, 0, 6, 6, 5, 0, 0, 0, 0, 1, 0, 0, 0, 0),
        {},
        (60.0, 100.0, 100.0),
    ),
    ("trade", "pay-succ", "sms"): ((6, 6, 6, 0, 6, 6, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0), {}, (30.0, 60.0, 60.0)),
    ("trade", "refund", "sms"): (
        (2, 2, 2, 0, 2, 5, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0),
        {},
        (1008.0, 6048.0, 6048.0),
    ),
    ("trade", "resend", "sms"): ((2, 2, 2, 0, 2, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0), {}, (4.0, 18.0, 18.0)),
    ("tx", "order", None): (
        (3, 3, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0),
        {"tx-unresolved": 1},
        (None, None, None),
    ),
    ("tx", "order", "stock"): (
        (2, 2, 1, 1, 2, 2, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0),
        {},
        (10018.0, 10018.0, 10018.0),
    ),
}


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("delivery-logs")
    known_logs().write(directory)
    return directory


@pytest.fixture(scope="module")
def report(spark: SparkSession, log_dir: Path) -> Report:
    return reconcile(spark, [str(log_dir / "*.log"), str(log_dir / "*.log.gz")])


def summary_of(report: Report) -> dict[tuple[str | None, ...], tuple[tuple[int, ...], dict[str, int], tuple]]:
    return {
        (row.topic, row.message_type, row.group): (
            tuple(getattr(row, name) for name in COUNT_COLUMNS),
            row.dead_lettered_by_reason,
            (row.latency_p50_ms, row.latency_p95_ms, row.latency_p99_ms),
        )
        for row in report.summary
    }


def test_every_row_counts_exactly(report: Report) -> None:
    assert list(summary_of(report)) == list(EXPECTED)
    for key, expected in EXPECTED.items():
        assert summary_of(report)[key] == expected, key


def test_verdict_and_detail_name_the_lost_and_the_rolled_back(report: Report) -> None:
    assert report.verdict == "FAIL: 4 lost, 1 delivered after rollback"
    assert report.exit_code == 1
    assert report.messages == 28
    assert report.detail_total == 5
    detail = {(row.kind, row.message_id, row.group) for row in report.detail}
    assert detail == {
        ("lost", "n6", "audit"),
        ("lost", "l1", "sms"),
        ("lost", "l2", "sms"),
        ("lost", "x4", "sms"),
        ("delivered_after_rollback", "t2", "stock"),
    }
    rolled = next(row for row in report.detail if row.kind == "delivered_after_rollback")
    assert (rolled.rolled_back_at, rolled.first_delivered_at, rolled.deliveries) == (at(521.0), at(522.0), 1)
    assert rolled.producer_group == "tx-svc"
    l1 = next(row for row in report.detail if row.message_id == "l1")
    assert (l1.last_event, l1.last_event_at, l1.brokers) == ("timeout", at(205.01), ["10.0.0.3:13800"])
    assert (l1.sent_at, l1.committed_at) == (at(200.002), at(200.0))


def test_malformed_lines_are_counted_not_fatal(report: Report) -> None:
    stats = report.input
    assert stats.problems == {"blank": 2, "not_json": 2, "missing_field": 2, "bad_ts": 1, "unknown_event": 1}
    assert stats.malformed == 5
    good = sum(len(lines) for lines in known_logs().files.values()) - 8
    assert stats.lines == good + 8
    assert stats.events == good
    assert stats.by_event["send_failed"] == 1
    assert stats.by_event["dead_lettered"] == 8
    assert stats.newest_ts == at(1000.0)


def test_grace_decides_between_pending_and_lost(spark: SparkSession, log_dir: Path) -> None:
    strict = reconcile(spark, [log_dir], grace_s=0)
    assert (strict.row("trade", "pay-fail", "sms").lost, strict.row("trade", "pay-fail", "sms").pending) == (
        3,
        0,
    )
    assert strict.lost == 5
    patient = reconcile(spark, [log_dir], grace_s=1000)
    assert (patient.lost, patient.delivered_after_rollback) == (0, 1)
    assert patient.row("trade", "expire", "sms").pending == 1
    assert patient.verdict == "FAIL: 0 lost, 1 delivered after rollback"


def test_filters_select_messages_by_topic_group_and_first_seen(spark: SparkSession, log_dir: Path) -> None:
    news = reconcile(spark, [log_dir], topics=["news"])
    assert [(r.topic, r.group) for r in news.summary] == [("news", "push")]
    assert (
        news.verdict
        == "OK: 2 messages, 1 acked by 1 group, 0 lost, 0 delivered after rollback, 5 malformed lines skipped"
    )
    assert news.exit_code == 0

    audit = reconcile(spark, [log_dir], groups=["audit"])
    assert [(r.message_type, r.group, r.lost) for r in audit.summary] == [("pay-succ", "audit", 1)]
    assert audit.messages == 6

    window = reconcile(spark, [log_dir], since=at(500.0), until=BASE.replace(minute=10))
    assert {(r.topic, r.group) for r in window.summary} == {("tx", None), ("tx", "stock")}
    assert window.row("tx", "order", None).sent == 2
    assert window.messages == 4


def test_same_answers_whatever_the_order_of_lines(
    spark: SparkSession, tmp_path: Path, report: Report
) -> None:
    logs = known_logs()
    merged = [line for lines in logs.files.values() for line in lines]
    other = DeliveryLogs()
    for line in merged:
        other.raw("all-in-one.log", line)
    paths = other.write(tmp_path, seed=1234)
    again = reconcile(spark, paths)
    assert summary_of(again) == summary_of(report)
    assert again.input.problems == report.input.problems


@pytest.mark.parametrize("seed", [1, 2])
def test_matches_a_plain_model_on_random_histories(spark: SparkSession, tmp_path: Path, seed: int) -> None:
    logs, events = random_logs(seed, messages=400)
    report = reconcile(spark, logs.write(tmp_path, seed=seed), detail_limit=10_000)
    summary, detail = model_report(events, grace_s=60)
    assert summary_of(report) == summary
    assert {(row.kind, row.message_id, row.group) for row in report.detail} == detail
    assert report.lost > 0 and report.delivered_after_rollback > 0  # the mix exercises both


def test_cli_json_and_csv_files(
    spark: SparkSession, log_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(log_dir), "--format", "json", "--out", str(tmp_path / "j")]) == 1
    document = json.loads((tmp_path / "j" / "report.json").read_text())
    assert (document["verdict"], document["lost"], document["delivered_after_rollback"]) == (
        "FAIL: 4 lost, 1 delivered after rollback",
        4,
        1,
    )
    assert len(document["summary"]) == len(EXPECTED) and document["input"]["malformed"] == 5
    assert {row["message_id"] for row in document["detail"]} == {"n6", "l1", "l2", "x4", "t2"}
    assert capsys.readouterr().out.rstrip().endswith("FAIL: 4 lost, 1 delivered after rollback")

    assert main([str(log_dir), "--format", "csv", "--out", str(tmp_path / "c"), "--detail-limit", "2"]) == 1
    with (tmp_path / "c" / "summary.csv").open() as handle:
        rows = {(r["topic"], r["message_type"], r["group"]): r for r in csv.DictReader(handle)}
    assert rows["trade", "expire", "sms"]["dead_lettered_by_reason"] == "deliver-limit=2;expired=2"
    assert rows["tx", "order", ""]["rolled_back"] == "1"
    assert rows["trade", "refund", "sms"]["duplicates"] == "3"
    detail = (tmp_path / "c" / "detail.csv").read_text().splitlines()
    assert detail[0].startswith("kind,message_id,topic") and len(detail) == 3
    assert "(first 2 shown)" in capsys.readouterr().out


def test_cli_ok_exit_codes_and_stdout_formats(
    spark: SparkSession, log_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(log_dir), "--topic", "news"]) == 0
    out = capsys.readouterr().out
    assert "flash" in out and out.rstrip().splitlines()[-1].startswith("OK: 2 messages")

    assert main([str(log_dir), "--topic", "news", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ok"] is True
    assert captured.err.rstrip().endswith("0 delivered after rollback, 5 malformed lines skipped")

    (tmp_path / "empty.log").write_text("\n")
    assert main([str(tmp_path / "empty.log")]) == 2


def test_table_is_narrow_unless_wide(
    spark: SparkSession, log_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(log_dir)]) == 1
    narrow = capsys.readouterr().out.splitlines()
    header = next(line for line in narrow if line.startswith("topic"))
    assert header.split() == list(NARROW_SUMMARY)
    assert max(map(len, narrow)) <= 100
    detail_header = next(line for line in narrow if line.startswith("kind"))
    assert detail_header.split() == list(NARROW_DETAIL)
    assert narrow[-1] == "FAIL: 4 lost, 1 delivered after rollback"

    assert main([str(log_dir), "--wide"]) == 1
    wide = capsys.readouterr().out.splitlines()
    header = next(line for line in wide if line.startswith("topic"))
    assert header.split() == [f.name for f in fields(SummaryRow)]
    assert next(line for line in wide if line.startswith("kind")).split() == [
        f.name for f in fields(DetailRow)
    ]
    assert wide[-1] == narrow[-1]


def test_cli_parquet_keeps_the_whole_detail(spark: SparkSession, log_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "p"
    assert main([str(log_dir), "--format", "parquet", "--out", str(out), "--detail-limit", "1"]) == 1
    assert spark.read.parquet(str(out / "detail")).count() == 5
    summary = spark.read.parquet(str(out / "summary"))
    assert summary.where("lost > 0").count() == 3


@pytest.mark.slow
def test_console_script_end_to_end(tmp_path: Path) -> None:
    """The installed `kiteq-reconcile` in a fresh process and JVM, as a user runs it."""
    logs = DeliveryLogs()
    logs.store("m1", 0.0, ["sms"])
    logs.deliver("m1", "sms", 0.01)
    logs.store("m2", 1.0, ["sms"])
    logs.broker_event("m2", "finished", 100.0)
    logs.write(tmp_path / "logs")
    script = Path(sys.executable).parent / "kiteq-reconcile"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    command = [
        str(script),
        str(tmp_path / "logs"),
        "--master",
        "local[1]",
        "--conf",
        "spark.ui.showConsoleProgress=false",
    ]
    command += ["--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=180, env=env, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.rstrip().splitlines()[-1] == "FAIL: 1 lost, 0 delivered after rollback"
    assert "reconcile.pass_done" in done.stderr
