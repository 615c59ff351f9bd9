"""Traffic nobody is bound to stays bounded: 100,000 messages to an unbound topic (each
dead-lettered after its one allowed delivery round) grow a `kiteq-server` process by
under 96 MiB, and their dead letters are written in batches, not one fsync each."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from kiteq import Message, Producer
from tests.helpers import registry_uri
from tests.procs.broker import BrokerProcess
from tests.procs.memory import memory_of
from tests.services.ports import wait_for_port

pytestmark = pytest.mark.faults

MIB = 1024 * 1024
MESSAGES = 100_000
BATCH = 1_000


async def test_unbound_traffic_does_not_grow_the_broker(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    broker = BrokerProcess(tmp_path, registry, extra=("--topic", "unbound"))
    await broker.start()
    assert broker.process is not None
    try:
        await trio.to_thread.run_sync(wait_for_port, broker.admin_port)
        before, _ = memory_of(broker.process.pid)
        fsyncs_before = int((await broker.stats())["store"]["details"]["fsyncs"])
        async with Producer(registry, group="p", topics=["unbound"], send_timeout=30) as producer:
            for _ in range(MESSAGES // BATCH):
                batch = [Message("unbound", "x", b"x" * 1024, deliver_limit=1) for _ in range(BATCH)]
                assert all(result.ok for result in await producer.send_many(batch))

        async def dead_letters() -> int:
            return int((await broker.stats())["dead_letters"]["total"])

        dead = 0
        with trio.fail_after(120):
            while dead < MESSAGES:
                await trio.sleep(0.5)
                dead = await dead_letters()
        _, peak = memory_of(broker.process.pid)
        stats = await broker.stats()
        assert stats["dead_letters"]["by_reason"] == {"no-binding": MESSAGES}
        assert stats["rounds_in_flight"] == 0
        fsyncs = int(stats["store"]["details"]["fsyncs"]) - fsyncs_before
        assert fsyncs < MESSAGES / 5, f"{fsyncs} fsyncs for {MESSAGES} saves and dead letters: not batched"
        assert peak - before < 96 * MIB, f"the broker grew by {(peak - before) / MIB:.1f} MiB at its peak"
    finally:
        await broker.stop()
