"""`kiteq-reconcile`: reconcile the delivery logs of producers, brokers and consumers with Spark.

Reads any mix of delivery-log files (paths, globs, or any URI Spark reads), reports per
topic / messageType / consumer group what was sent, stored, committed, delivered, acked,
duplicated, dead-lettered and lost, and exits 1 when a message was lost or a rolled-back
message was delivered. The definitions of every column are in docs/reconcile.md.

The data stays in Spark: one pass parses and aggregates the lines into one cached row
per (message, group); only the aggregated summary and the (limited) detail reach the driver.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from spark_jobs._events import KNOWN_EVENTS, PROBLEMS, parse_lines
from spark_jobs._ledger import DETAIL_COLUMNS, Filters, detail, ledger, summary
from spark_jobs._report import (
    DetailRow,
    InputStats,
    Report,
    SummaryRow,
    render_table,
    summary_csv,
    to_json,
    write_files,
)
from spark_jobs.session import spark_session

__all__ = ["Filters", "Reconciliation", "Report", "main", "reconcile", "start_reconciliation"]

DEFAULT_GRACE_S = 60.0
DEFAULT_DETAIL_LIMIT = 1000
FORMATS = ("table", "json", "csv", "parquet")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

log = structlog.wrap_logger(
    structlog.PrintLogger(sys.stderr),
    processors=[
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.dev.ConsoleRenderer(colors=False),
    ],
)


@dataclass
class Reconciliation:
    """The computed ledger, cached in Spark, with the frames a report is collected from.

    `summary` and `detail` are complete DataFrames (write them anywhere Spark writes);
    `release()` drops the cache.
    """

    input: InputStats
    messages: int
    grace_s: float
    summary: DataFrame
    detail: DataFrame
    _pairs: DataFrame

    def report(self, detail_limit: int = DEFAULT_DETAIL_LIMIT) -> Report:
        """Collect the summary and at most `detail_limit` detail rows to the driver."""
        summary_rows = [SummaryRow(**row.asDict()) for row in self.summary.collect()]
        detail_total = sum(
            row.lost + row.delivered_after_rollback + row.delivered_after_cancel for row in summary_rows
        )
        times = (
            "sent_at",
            "committed_at",
            "rolled_back_at",
            "deliver_at",
            "cancelled_at",
            "first_delivered_at",
            "last_event_at",
        )
        limited = self.detail.limit(detail_limit).select(
            *(F.unix_micros(name).alias(name) if name in times else F.col(name) for name in DETAIL_COLUMNS)
        )
        detail_rows = [_detail_row(row, times) for row in limited.collect()] if detail_total else []
        return Report(summary_rows, detail_rows, detail_total, self.input, self.messages, self.grace_s)

    def release(self) -> None:
        self._pairs.unpersist()


def start_reconciliation(
    spark: SparkSession,
    paths: Sequence[str | Path],
    filters: Filters | None = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> Reconciliation:
    """Run the pass over the logs and cache its ledger; the caller must `release()` it."""
    lines = spark.read.text([str(p) for p in paths])
    events, line_counts = parse_lines(lines)
    # As many partitions as input splits (128 MiB each by default), and at least one per core.
    partitions = max(spark.sparkContext.defaultParallelism, lines.rdd.getNumPartitions())
    pairs = ledger(events, filters or Filters(), partitions).persist()
    try:
        totals = pairs.agg(F.count_if("first_row_of_message").alias("messages")).first()
        messages = totals["messages"] if totals else 0
        counts, newest_us = line_counts.collect(observed=messages > 0)
    except BaseException:
        pairs.unpersist()
        raise
    stats = InputStats(
        lines=counts["lines"],
        events=sum(counts[f"event_{e}"] for e in KNOWN_EVENTS),
        problems={kind: counts[kind] for kind in PROBLEMS},
        by_event={e: counts[f"event_{e}"] for e in KNOWN_EVENTS},
        newest_ts=_from_micros(newest_us),
    )
    return Reconciliation(
        input=stats,
        messages=messages,
        grace_s=grace_s,
        summary=summary(pairs, newest_us, grace_s),
        detail=detail(pairs, newest_us, grace_s),
        _pairs=pairs,
    )


def reconcile(
    spark: SparkSession,
    paths: Sequence[str | Path],
    *,
    since: datetime.datetime | None = None,
    until: datetime.datetime | None = None,
    topics: Sequence[str] = (),
    groups: Sequence[str] = (),
    grace_s: float = DEFAULT_GRACE_S,
    detail_limit: int = DEFAULT_DETAIL_LIMIT,
) -> Report:
    """Reconcile the delivery logs under `paths`; see the module docstring and docs/reconcile.md."""
    run = start_reconciliation(spark, paths, Filters(since, until, tuple(topics), tuple(groups)), grace_s)
    try:
        return run.report(detail_limit)
    finally:
        run.release()


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: 0 when all is well, 1 when anything is lost or delivered after rollback, 2 on bad input."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.format == "parquet" and args.out is None:
        parser.error("--format parquet needs --out DIR")
    if args.grace < 0:
        parser.error("--grace must not be negative")
    missing = [path for path in args.paths if not _local_path_exists(path)]
    if missing:
        parser.error("no such path: " + ", ".join(missing))
    filters = Filters(args.since, args.until, tuple(args.topic), tuple(args.group))
    with _session(args.master, args.conf) as spark:
        started = time.monotonic()
        log.info("reconcile.reading", paths=len(args.paths), master=spark.sparkContext.master)
        try:
            run = start_reconciliation(spark, args.paths, filters, args.grace)
        except AnalysisException as exc:
            log.error("reconcile.unreadable_input", error=str(exc).splitlines()[0])
            return 2
        try:
            log.info(
                "reconcile.pass_done",
                lines=run.input.lines,
                events=run.input.events,
                messages=run.messages,
                seconds=round(time.monotonic() - started, 1),
            )
            report = run.report(args.detail_limit)
            if args.format == "parquet":
                run.summary.write.mode("overwrite").parquet(str(args.out / "summary"))
                run.detail.write.mode("overwrite").parquet(str(args.out / "detail"))
        finally:
            run.release()
        log.info("reconcile.done", seconds=round(time.monotonic() - started, 1))
    if run.input.events == 0:
        log.error("reconcile.no_events", lines=run.input.lines, skipped=run.input.problems)
        return 2
    _emit(report, args.format, args.out, args.wide)
    return report.exit_code


def _emit(report: Report, fmt: str, out: Path | None, wide: bool) -> None:
    """Files under --out in the format, the table on stdout; without --out, the format on stdout."""
    if out is not None:
        written = (
            write_files(report, out, fmt, wide) if fmt != "parquet" else [out / "summary", out / "detail"]
        )
        log.info("reconcile.written", files=[str(p) for p in written])
        sys.stdout.write(render_table(report, wide))
        return
    if fmt == "json":
        sys.stdout.write(json.dumps(to_json(report), indent=2) + "\n")
    elif fmt == "csv":
        sys.stdout.write(summary_csv(report))
    else:
        sys.stdout.write(render_table(report, wide))
        return
    sys.stderr.write(report.verdict + "\n")


def _local_path_exists(path: str) -> bool:
    """Whether a local path or glob names something; other URIs (hdfs://, s3a://) are Spark's to check.

    Checked before Spark starts, so a typo fails in milliseconds rather than after the JVM's
    start. Brace globs (`{a,b}`) are Hadoop syntax Python's glob does not speak: left to Spark.
    """
    scheme, colon, rest = path.partition(":")
    if colon and scheme != "file" and "/" not in scheme:
        return True
    local = rest.removeprefix("//") if scheme == "file" else path
    if "{" in local:
        return True
    if any(char in local for char in "*?["):
        return bool(glob.glob(local))
    return Path(local).exists()


@contextmanager
def _session(master: str, conf: Sequence[tuple[str, str]]) -> Iterator[SparkSession]:
    """The active SparkSession if there is one (tests, notebooks), else a new one stopped at the end."""
    active = SparkSession.getActiveSession()
    if active is not None:
        if active.sparkContext.master != master:
            log.warning("reconcile.session_reused", master=active.sparkContext.master, ignored_master=master)
        yield active
        return
    settings = {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "true"}
    if master.startswith("local"):
        # Keep a local run on loopback: by default Spark binds the driver and its UI to the outside address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings |= {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
        }
    settings |= dict(conf)
    with spark_session(master, "kiteq-reconcile", settings) as spark:
        yield spark


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kiteq-reconcile",
        description="Reconcile KiteQ delivery logs (producers, brokers, consumers) with Spark.",
        epilog="Exit status: 0 all accounted for, 1 lost or delivered-after-rollback messages, 2 bad input.",
    )
    parser.add_argument("paths", nargs="+", help="delivery-log files, directories, globs or URIs Spark reads")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {importlib.metadata.version('kiteq-py')}"
    )
    parser.add_argument("--master", default="local[*]", help="Spark master URL (default: local[*])")
    parser.add_argument(
        "--since", type=_utc_time, help="only messages first seen at or after this ISO-8601 time"
    )
    parser.add_argument("--until", type=_utc_time, help="only messages first seen before this ISO-8601 time")
    parser.add_argument("--topic", action="append", default=[], help="only this topic (repeatable)")
    parser.add_argument("--group", action="append", default=[], help="only this consumer group (repeatable)")
    parser.add_argument("--out", type=Path, help="write the report into this directory")
    parser.add_argument("--format", choices=FORMATS, default="table", help="report format (default: table)")
    parser.add_argument(
        "--wide", action="store_true", help="every column in the table (default: the ones read first)"
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE_S,
        metavar="SECONDS",
        help="messages committed less than this before the newest event are pending, not lost (default: 60)",
    )
    parser.add_argument(
        "--detail-limit",
        type=int,
        default=DEFAULT_DETAIL_LIMIT,
        metavar="N",
        help="at most N detail rows in table/json/csv output; parquet gets all (default: 1000)",
    )
    parser.add_argument(
        "--conf",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting",
    )
    return parser


def _utc_time(text: str) -> datetime.datetime:
    """An ISO-8601 time; without a zone it is UTC, like the logs."""
    moment = datetime.datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _from_micros(micros: int | None) -> datetime.datetime | None:
    return None if micros is None else _EPOCH + datetime.timedelta(microseconds=micros)


def _detail_row(row: Row, times: tuple[str, ...]) -> DetailRow:
    values = row.asDict()
    for name in times:
        values[name] = _from_micros(values[name])
    values["brokers"] = list(values["brokers"] or [])
    return DetailRow(**values)


if __name__ == "__main__":
    raise SystemExit(main())
