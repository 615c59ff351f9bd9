"""The delivery logs of a real run (broker, producer, consumers, one consumer killed) reconcile clean."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from kiteq import Binding, Consumer, Message, Producer
from spark_jobs.reconcile import reconcile
from tests.helpers import RecordingListener, registry_uri, wait_until
from tests.procs.broker import BrokerProcess
from tests.procs.runner import ClientProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MESSAGES = 5000


async def run_traffic(tmp_path: Path, logs: Path) -> set[str]:
    registry = registry_uri(tmp_path)
    broker = BrokerProcess(
        tmp_path,
        registry,
        extra=("--delivery-log", str(logs / "broker.log"), "--retry-base", "0.2", "--deliver-timeout", "2"),
    )
    await broker.start()
    worker, audit = RecordingListener(), RecordingListener()
    try:
        async with trio.open_nursery() as nursery:
            doomed = await nursery.start(
                ClientProcess(
                    "consumer",
                    "--registry",
                    registry,
                    "--group",
                    "workers",
                    "--watermark",
                    "200",
                    "--delivery-log",
                    str(logs / "consumer-doomed.log"),
                ).run
            )
            await wait_until(lambda: "ready" in doomed.lines, what="the doomed consumer")
            async with (
                Consumer(
                    registry,
                    group="workers",
                    bindings=[Binding.direct("t", "x", watermark=200)],
                    listener=worker,
                    delivery_log=str(logs / "consumer-worker.log"),
                ),
                Consumer(
                    registry,
                    group="audit",
                    bindings=[Binding.fanout("t")],
                    listener=audit,
                    delivery_log=str(logs / "consumer-audit.log"),
                ),
                Producer(
                    registry, group="shop", topics=["t"], delivery_log=str(logs / "producer.log")
                ) as producer,
            ):
                await broker.wait_bindings(2)
                sent: set[str] = set()
                for start in range(0, MESSAGES, 500):
                    results = await producer.send_many([Message("t", "x", b"payload") for _ in range(500)])
                    sent |= {r.message_id for r in results if r.ok}
                    if start == 2000:
                        doomed.kill()
                await wait_until(
                    lambda: sent <= audit.acked_ids and sent <= worker.acked_ids | set(doomed.words("acked")),
                    timeout=90,
                    what="every message acked by both groups",
                )
                nursery.cancel_scope.cancel()
    finally:
        await broker.stop()
    return sent


async def test_real_run_reconciles_with_zero_lost(tmp_path: Path, spark) -> None:  # type: ignore[no-untyped-def]
    logs = tmp_path / "logs"
    logs.mkdir()
    sent = await run_traffic(tmp_path, logs)
    assert len(sent) == MESSAGES
    report = await trio.to_thread.run_sync(lambda: reconcile(spark, [str(logs / "*.log")], grace_s=0))
    assert report.lost == 0, report.detail
    assert report.delivered_after_rollback == 0
    assert report.ok
    workers = report.row("t", "x", "workers")
    audit = report.row("t", "x", "audit")
    assert workers.acked == MESSAGES and audit.acked == MESSAGES
    assert workers.sent == MESSAGES and workers.stored == MESSAGES
