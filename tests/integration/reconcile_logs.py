"""Build delivery logs with known answers for the reconciliation tests.

A `DeliveryLogs` collects lines per file the way producers, brokers and consumers write
them (one JSON object per line, `ts` in ISO-8601 UTC), with times given as seconds after
`BASE`, then writes the files with each file's lines shuffled: the job must not depend
on the order of lines.
"""

from __future__ import annotations

import datetime
import gzip
import json
import math
import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

BASE = datetime.datetime(2026, 11, 21, 10, 0, tzinfo=datetime.UTC)
_BASE_MS = round(BASE.timestamp() * 1000)


def at(seconds: float) -> datetime.datetime:
    """The moment `seconds` after BASE (to the microsecond)."""
    return BASE + datetime.timedelta(microseconds=round(seconds * 1_000_000))


def epoch_ms(seconds: float) -> int:
    """`at(seconds)` as Unix milliseconds, the unit of a `scheduled` event's `deliver_at`."""
    return _BASE_MS + round(seconds * 1000)


def iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class DeliveryLogs:
    """Delivery-log lines by file name; `write()` puts them on disk (`.gz` names compressed)."""

    def __init__(self) -> None:
        self.files: dict[str, list[str]] = defaultdict(list)

    def line(self, file: str, event: str, message_id: str, seconds: float, **fields: object) -> None:
        """One event; `fields` adds or overrides contract fields (None values are left out)."""
        record: dict[str, object] = {
            "ts": iso(at(seconds)),
            "event": event,
            "message_id": message_id,
            "topic": "trade",
            "message_type": "pay-succ",
            "producer_group": "order-svc",
        }
        record.update(fields)
        self.files[file].append(json.dumps({k: v for k, v in record.items() if v is not None}))

    def raw(self, file: str, text: str) -> None:
        """A line as is (for malformed input)."""
        self.files[file].append(text)

    def store(
        self,
        message_id: str,
        seconds: float,
        groups: Sequence[str] | None,
        *,
        broker: str = "b1",
        commit: bool = True,
        producer: str = "producer.log",
        **fields: object,
    ) -> None:
        """The broker stores (routing to `groups` when commit) and the producer logs `sent` 2 ms later."""
        routed = list(groups) if commit and groups is not None else None
        self.line(
            f"{broker}.log",
            "stored",
            message_id,
            seconds,
            broker=_address(broker),
            source="broker",
            commit=True if commit else None,
            groups=routed,
            **fields,
        )
        self.line(
            producer,
            "sent",
            message_id,
            seconds + 0.002,
            source="producer",
            broker=_address(broker),
            **fields,
        )

    def deliver(
        self,
        message_id: str,
        group: str,
        seconds: float,
        *,
        outcome: str | None = "acked",
        answer_after: float = 0.01,
        attempt: int = 1,
        broker: str = "b1",
        **fields: object,
    ) -> None:
        """The broker pushes to `group`; the consumer logs it; `outcome` (acked/nacked/timeout) follows."""
        common = {"group": group, "broker": _address(broker), **fields}
        self.line(
            f"{broker}.log", "delivered", message_id, seconds, attempt=attempt, source="broker", **common
        )
        self.line(
            f"consumer-{group}.log.gz", "received", message_id, seconds + 0.001, source="consumer", **common
        )
        if outcome is None:
            return
        if outcome != "timeout":
            self.line(
                f"consumer-{group}.log.gz",
                "processed",
                message_id,
                seconds + 0.002,
                source="consumer",
                **common,
            )
        self.line(
            f"{broker}.log",
            outcome,
            message_id,
            seconds + answer_after,
            attempt=attempt,
            source="broker",
            latency_ms=answer_after * 1000,
            **common,
        )

    def broker_event(
        self, message_id: str, event: str, seconds: float, *, broker: str = "b1", **fields: object
    ) -> None:
        """Any other broker event (committed, rolled_back, dead_lettered, redriven, dropped, …)."""
        self.line(
            f"{broker}.log", event, message_id, seconds, broker=_address(broker), source="broker", **fields
        )

    def write(self, directory: Path, seed: int = 8) -> list[Path]:
        """Write every file with its lines shuffled; the paths written."""
        rng = random.Random(seed)
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, lines in sorted(self.files.items()):
            shuffled = list(lines)
            rng.shuffle(shuffled)
            data = ("\n".join(shuffled) + "\n").encode()
            path = directory / name
            path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
            paths.append(path)
        return paths


def _address(broker: str) -> str:
    return {"b1": "10.0.0.1:13800", "b2": "10.0.0.2:13800", "b3": "10.0.0.3:13800"}.get(broker, broker)


# --- A random mix of message histories, and a plain-Python model of the report's definitions ---

COUNT_COLUMNS = (
    "sent",
    "stored",
    "committed",
    "rolled_back",
    "delivered",
    "deliveries",
    "acked",
    "duplicates",
    "dropped",
    "dead_lettered",
    "pending",
    "lost",
    "delivered_after_rollback",
    "scheduled",
    "cancelled",
    "delivered_after_cancel",
)
QUANTILES = (0.5, 0.95, 0.99)


def random_logs(seed: int, messages: int) -> tuple[DeliveryLogs, list[dict[str, object]]]:
    """Random histories (commit modes, schedules and cancels, redeliveries, drops, dead letters,
    redrives, several brokers, missing producer lines and routing) at distinct random times:
    the logs, and every event."""
    rng = random.Random(seed)
    moments = iter(rng.sample(range(1, 1_000_000_000), messages * 40))
    events: list[dict[str, object]] = []

    def emit(event: str, mid: str, base: dict[str, object], **fields: object) -> None:
        events.append({**base, "event": event, "message_id": mid, "us": next(moments), **fields})

    for i in range(messages):
        mid = f"m{i:05d}"
        base = {"topic": rng.choice(["t1", "t2"]), "message_type": rng.choice(["a", "b"])}
        mode = rng.choice(["direct", "direct", "direct", "tx_commit", "tx_rollback", "tx_open", "fail"])
        bound = sorted(rng.sample(["g1", "g2", "g3"], rng.randint(0, 3)))
        brokers = rng.sample(["b1", "b2", "b3"], 2 if rng.random() < 0.1 else 1)
        home = {**base, "broker": brokers[0]}
        if mode == "fail":
            emit("send_failed", mid, base, reason="timeout")
            continue
        # One in ten brokers logs no routing: only the deliveries tell where the message went.
        logged = bound if rng.random() < 0.9 else None
        for broker in brokers:
            routed = {"commit": True, "groups": logged} if mode == "direct" else {}
            emit("stored", mid, {**base, "broker": broker}, **routed)
        if rng.random() < 0.9:
            emit("sent", mid, base)
        if mode == "direct" and rng.random() < 0.2:
            # Due anywhere from long before the newest event to after it, in whole milliseconds.
            due_ms = rng.randrange(0, 1_100_000)
            emit("scheduled", mid, home, deliver_at=_BASE_MS + due_ms, due_us=due_ms * 1000)
            if rng.random() < 0.3:
                emit("cancelled", mid, home)
        if mode == "tx_commit":
            emit("committed", mid, home, groups=bound)
        elif mode == "tx_rollback":
            emit("rolled_back", mid, home)
        targets = bound + (["g9"] if rng.random() < 0.1 else [])
        if mode in ("tx_open", "tx_rollback"):
            targets = [g for g in targets if rng.random() < 0.2]
        for group in targets:
            for attempt in range(1, rng.choice([0, 1, 1, 1, 2, 3]) + 1):
                at_broker = {**base, "broker": rng.choice(brokers), "group": group, "attempt": attempt}
                emit("delivered", mid, at_broker)
                outcome = rng.choice(["acked", "acked", "nacked", "timeout", None])
                if outcome:
                    emit(outcome, mid, at_broker)
            if rng.random() < 0.1:
                emit("dropped", mid, home, group=group)
            if rng.random() < 0.05:
                emit("dead_lettered", mid, home, group=group, reason="deliver-limit")
        if rng.random() < 0.15:
            emit("dead_lettered", mid, home, reason=rng.choice(["expired", "deliver-limit"]))
            if rng.random() < 0.5:
                emit("redriven", mid, home)
    logs = DeliveryLogs()
    for record in events:
        fields = {k: v for k, v in record.items() if k not in ("event", "message_id", "us", "due_us")}
        file = f"{fields['broker']}.log" if "broker" in fields else "producer.log"
        logs.line(file, str(record["event"]), str(record["message_id"]), int(record["us"]) / 1e6, **fields)
    return logs, events


ModelSummary = dict[
    tuple[object, object, str | None], tuple[tuple[int, ...], dict[str, int], tuple[float | None, ...]]
]


def model_report(
    events: list[dict[str, object]], grace_s: float
) -> tuple[ModelSummary, set[tuple[str, str, str | None]]]:
    """The summary ({(topic, type, group): (counts, by_reason, latencies)}) and the detail
    ({(kind, message_id, group)}) as docs/reconcile.md defines them, computed plainly."""
    horizon = max(int(e["us"]) for e in events)
    by_message: dict[str, list[dict[str, object]]] = defaultdict(list)
    for e in events:
        by_message[str(e["message_id"])].append(e)
    rows: dict[tuple, dict[str, object]] = {}
    detail: set[tuple[str, str, str | None]] = set()

    def first(evs: list[dict[str, object]], *names: str) -> int | None:
        times = [int(e["us"]) for e in evs if e["event"] in names]
        return min(times) if times else None

    for mid, evs in by_message.items():
        own = [e for e in evs if "group" not in e]
        sent, stored, rolled = first(own, "sent"), first(own, "stored"), first(own, "rolled_back")
        commits = [
            int(e["us"])
            for e in own
            if e["event"] == "committed" or (e["event"] == "stored" and e.get("commit"))
        ]
        committed = min(commits) if commits else None
        bound = {
            g
            for e in own
            if e["event"] in ("stored", "committed", "scheduled")
            for g in e.get("groups") or []
        }
        cancelled = first(own, "cancelled")
        dues = [int(e["due_us"]) for e in own if e["event"] == "scheduled"]
        due = max(dues) if dues else None
        names = sorted(bound | {str(e["group"]) for e in evs if "group" in e}) or [None]
        for group in names:
            mine = [e for e in evs if e.get("group") == group] if group else []
            dead = [e for e in own + mine if e["event"] == "dead_lettered"]
            redrives = [int(e["us"]) for e in own + mine if e["event"] == "redriven"]
            last_dead = max(dead, key=lambda e: int(e["us"])) if dead else None
            redriven = max(redrives) if redrives else None
            in_dlq = last_dead is not None and (redriven is None or int(last_dead["us"]) > redriven)
            delivered = [int(e["us"]) for e in mine if e["event"] == "delivered"]
            deliveries = len(delivered)
            acked_at = first(mine, "acked")
            drops = any(e["event"] == "dropped" for e in mine)
            acked = acked_at is not None
            routed = group in bound or deliveries > 0
            expected = (
                (sent or stored) is not None
                and committed is not None
                and rolled is None
                and cancelled is None
                and routed
            )
            open_ = expected and not acked and not in_dlq and not drops
            ready = max(t for t in (committed, redriven, due) if t is not None) if open_ else 0
            lost = open_ and ready <= horizon - grace_s * 1e6
            start = sent if sent is not None else stored
            flags = {
                "sent": sent is not None,
                "stored": stored is not None,
                "committed": committed is not None,
                "rolled_back": rolled is not None,
                "delivered": deliveries > 0,
                "deliveries": deliveries,
                "acked": acked,
                "duplicates": max(deliveries - 1, 0) if acked else 0,
                "dropped": not acked and not in_dlq and drops,
                "dead_lettered": not acked and in_dlq,
                "pending": open_ and not lost,
                "lost": lost,
                "delivered_after_rollback": rolled is not None and deliveries > 0,
                "scheduled": due is not None,
                "cancelled": cancelled is not None,
                "delivered_after_cancel": cancelled is not None and any(t >= cancelled for t in delivered),
            }
            key = (evs[0]["topic"], evs[0]["message_type"], group)
            row = rows.setdefault(
                key, {"counts": dict.fromkeys(COUNT_COLUMNS, 0), "reasons": {}, "latency": []}
            )
            for name, value in flags.items():
                row["counts"][name] += int(value)
            if flags["dead_lettered"] and last_dead is not None:
                reason = str(last_dead.get("reason", "unspecified"))
                row["reasons"][reason] = row["reasons"].get(reason, 0) + 1
            if acked and start is not None:
                row["latency"].append(round((acked_at - start) / 1000, 3))
            if lost:
                detail.add(("lost", mid, group))
            if flags["delivered_after_rollback"]:
                detail.add(("delivered_after_rollback", mid, group))
            elif flags["delivered_after_cancel"]:
                detail.add(("delivered_after_cancel", mid, group))
    summary = {
        key: (tuple(row["counts"][c] for c in COUNT_COLUMNS), row["reasons"], _quantiles(row["latency"]))
        for key, row in rows.items()
    }
    return summary, detail


def _quantiles(samples: list[float]) -> tuple[float | None, ...]:
    """Exact percentiles by rank ceil(q·n), which Spark's percentile_approx gives for small n."""
    ordered = sorted(samples)
    if not ordered:
        return (None,) * len(QUANTILES)
    return tuple(ordered[max(1, math.ceil(q * len(ordered))) - 1] for q in QUANTILES)
