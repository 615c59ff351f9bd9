"""The reconciliation report as plain Python values, and its renderings (table, JSON, CSV).

Everything here runs on the driver over the small, already aggregated results; no Spark.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from spark_jobs._events import KNOWN_EVENTS, MALFORMED, PROBLEMS

# Where the list of events wraps, so that only a table's own rows can be wider.
LINE_WIDTH = 100
# The columns of the default (narrow) table: what an operator reads first. `--wide` shows all.
NARROW_SUMMARY = (
    "topic",
    "message_type",
    "group",
    "acked",
    "dead_lettered",
    "pending",
    "lost",
    "delivered_after_rollback",
)
# Shown in the narrow table too, but only when some row is not 0: rare failures worth a column then.
NARROW_IF_SEEN = ("delivered_after_cancel",)
NARROW_DETAIL = (
    "kind",
    "message_id",
    "group",
    "deliveries",
    "last_event",
    "last_event_at",
)


@dataclass(frozen=True)
class InputStats:
    """What was read: lines, usable events, and every other line counted by why it was skipped."""

    lines: int
    events: int
    problems: dict[str, int]
    by_event: dict[str, int]
    newest_ts: datetime.datetime | None

    @property
    def malformed(self) -> int:
        """Lines that are not JSON, miss a required field, or carry an unreadable `ts`."""
        return sum(self.problems.get(kind, 0) for kind in MALFORMED)


@dataclass(frozen=True)
class SummaryRow:
    """The counts of one (topic, message_type, group); `group` None holds messages of no group."""

    topic: str | None
    message_type: str | None
    group: str | None
    sent: int
    stored: int
    committed: int
    rolled_back: int
    scheduled: int
    cancelled: int
    delivered: int
    deliveries: int
    acked: int
    duplicates: int
    dropped: int
    dead_lettered: int
    dead_lettered_by_reason: dict[str, int]
    pending: int
    lost: int
    delivered_after_rollback: int
    delivered_after_cancel: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None


@dataclass(frozen=True)
class DetailRow:
    """One lost, delivered-after-rollback or -cancel (message, group), with what helps to chase it."""

    kind: str
    message_id: str
    topic: str | None
    message_type: str | None
    group: str | None
    producer_group: str | None
    brokers: list[str]
    sent_at: datetime.datetime | None
    committed_at: datetime.datetime | None
    rolled_back_at: datetime.datetime | None
    deliver_at: datetime.datetime | None
    cancelled_at: datetime.datetime | None
    deliveries: int
    first_delivered_at: datetime.datetime | None
    last_event: str | None
    last_event_at: datetime.datetime | None


@dataclass(frozen=True)
class Report:
    """Summary rows, the detail (at most `detail_limit` rows of `detail_total`), the input's health."""

    summary: list[SummaryRow]
    detail: list[DetailRow]
    detail_total: int
    input: InputStats
    messages: int
    grace_s: float

    @property
    def lost(self) -> int:
        return sum(row.lost for row in self.summary)

    @property
    def delivered_after_rollback(self) -> int:
        return sum(row.delivered_after_rollback for row in self.summary)

    @property
    def delivered_after_cancel(self) -> int:
        return sum(row.delivered_after_cancel for row in self.summary)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.delivered_after_rollback == 0 and self.delivered_after_cancel == 0

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    @property
    def verdict(self) -> str:
        """One line: `OK: …` or `FAIL: N lost, M delivered after rollback[, K delivered after cancel]`."""
        if not self.ok:
            verdict = f"FAIL: {self.lost} lost, {self.delivered_after_rollback} delivered after rollback"
            if self.delivered_after_cancel:
                verdict += f", {self.delivered_after_cancel} delivered after cancel"
            return verdict
        acked = sum(row.acked for row in self.summary)
        groups = len({row.group for row in self.summary if row.group is not None})
        parts = [
            f"OK: {self.messages} messages, {acked} acked by {groups} group{'' if groups == 1 else 's'}, "
            "0 lost, 0 delivered after rollback"
        ]
        pending = sum(row.pending for row in self.summary)
        if pending:
            parts.append(f"{pending} pending (younger than the {self.grace_s:g} s grace)")
        if self.input.malformed:
            parts.append(f"{self.input.malformed} malformed lines skipped")
        return ", ".join(parts)

    def row(self, topic: str, message_type: str, group: str | None) -> SummaryRow:
        """The summary row of one (topic, message_type, group); KeyError if the logs have none."""
        for row in self.summary:
            if (row.topic, row.message_type, row.group) == (topic, message_type, group):
                return row
        raise KeyError((topic, message_type, group))


def to_json(report: Report) -> dict[str, object]:
    """The whole report as JSON-ready values (timestamps as ISO-8601 UTC strings)."""
    return {
        "verdict": report.verdict,
        "ok": report.ok,
        "lost": report.lost,
        "delivered_after_rollback": report.delivered_after_rollback,
        "delivered_after_cancel": report.delivered_after_cancel,
        "messages": report.messages,
        "grace_s": report.grace_s,
        "input": {**_plain(asdict(report.input)), "malformed": report.input.malformed},
        "summary": [_plain(asdict(row)) for row in report.summary],
        "detail_total": report.detail_total,
        "detail": [_plain(asdict(row)) for row in report.detail],
    }


def summary_csv(report: Report) -> str:
    """The summary as CSV; dead letters by reason as `reason=count;…`."""
    return _csv(SummaryRow, [_flat(asdict(row)) for row in report.summary])


def detail_csv(report: Report) -> str:
    """The detail as CSV; brokers joined by spaces."""
    return _csv(DetailRow, [_flat(asdict(row)) for row in report.detail])


def write_files(report: Report, out: Path, fmt: str, wide: bool = False) -> list[Path]:
    """Write the report under `out` in `fmt` (table, json or csv); the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "table":
        files = {"report.txt": render_table(report, wide)}
    elif fmt == "json":
        files = {"report.json": json.dumps(to_json(report), indent=2) + "\n"}
    elif fmt == "csv":
        files = {"summary.csv": summary_csv(report), "detail.csv": detail_csv(report)}
    else:
        raise ValueError(f"no file writer for format {fmt!r}")
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return [out / name for name in files]


def render_table(report: Report, wide: bool = False) -> str:
    """The report for people: summary table, detail, input health, and the verdict last.

    Narrow by default (NARROW_SUMMARY, NARROW_DETAIL), every column when `wide`.
    """
    out = io.StringIO()
    stats = report.input
    newest = _iso(stats.newest_ts) if stats.newest_ts else "-"
    out.write(f"Input: {stats.lines} lines, {stats.events} events, newest event at {newest}\n")
    skipped = {kind: stats.problems[kind] for kind in PROBLEMS if stats.problems.get(kind)}
    if skipped:
        out.write("Skipped lines: " + ", ".join(f"{kind} {n}" for kind, n in skipped.items()) + "\n")
    seen = [f"{name} {stats.by_event[name]}" for name in KNOWN_EVENTS if stats.by_event.get(name)]
    out.write(_wrapped("Events:", seen or ["none"]) + "\n\n")
    headers = _summary_headers(report, wide)
    rows = [[_cell(name, getattr(row, name)) for name in headers] for row in report.summary]
    out.write(_table(headers, rows) if rows else "No messages.\n")
    if report.detail_total:
        shown = len(report.detail)
        more = f" (first {shown} shown)" if shown < report.detail_total else ""
        out.write(f"\nDetail: {report.detail_total} lost or delivered after rollback or cancel{more}\n")
        headers = [f.name for f in fields(DetailRow)] if wide else list(NARROW_DETAIL)
        rows = [[_cell(name, getattr(row, name)) for name in headers] for row in report.detail]
        out.write(_table(headers, rows))
    out.write(f"\n{report.verdict}\n")
    return out.getvalue()


def _wrapped(prefix: str, items: list[str]) -> str:
    """`prefix` and the items, comma-separated, in lines of at most LINE_WIDTH (an item is never split)."""
    lines = [prefix]
    for i, item in enumerate(items):
        text = item + ("," if i < len(items) - 1 else "")
        if len(lines[-1]) + 1 + len(text) > LINE_WIDTH:
            lines.append(" ")
        lines[-1] += " " + text
    return "\n".join(lines)


def _summary_headers(report: Report, wide: bool) -> list[str]:
    if wide:
        return [f.name for f in fields(SummaryRow)]
    seen = [name for name in NARROW_IF_SEEN if any(getattr(row, name) for row in report.summary)]
    return [*NARROW_SUMMARY, *seen]


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    numeric = [all(_is_number(r[i]) for r in rows) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        padded = (c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric, strict=True))
        return "  ".join(padded).rstrip() + "\n"

    return line(headers) + line(["-" * w for w in widths]) + "".join(line(r) for r in rows)


def _is_number(text: str) -> bool:
    return text == "-" or text.replace(".", "", 1).isdigit()


def _cell(name: str, value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in sorted(value.items())) or "-"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    if isinstance(value, datetime.datetime):
        return _iso(value)
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _plain(values: dict[str, object]) -> dict[str, object]:
    return {k: _iso(v) if isinstance(v, datetime.datetime) else v for k, v in values.items()}


def _flat(values: dict[str, object]) -> dict[str, object]:
    """CSV cells: maps as `k=v;…`, lists space-separated, times ISO, None empty."""
    flat: dict[str, object] = {}
    for key, value in _plain(values).items():
        if isinstance(value, dict):
            value = ";".join(f"{k}={v}" for k, v in sorted(value.items()))
        elif isinstance(value, list):
            value = " ".join(map(str, value))
        flat[key] = "" if value is None else value
    return flat


def _csv(kind: type, rows: list[dict[str, object]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[f.name for f in fields(kind)], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
