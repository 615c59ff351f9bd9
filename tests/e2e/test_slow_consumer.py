"""A consumer that reads slowly, with a small receive buffer (as KiteQ's Go client sets
16 KiB), harms only itself: no duplicates while it is merely slow, its heartbeats are
answered, and another group and the producer are served all the while.

The slow consumer is a raw socket, reading a few KiB at a time, as a foreign client would.
"""

from __future__ import annotations

from pathlib import Path

import trio

from kiteq import Binding, Consumer, Message, Producer
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.procs.slow_reader import SlowReader

MESSAGES = 1500  # at the slow reader's ~200 KB/s, ~8 s for all of them: far past deliver_timeout
# A heartbeat reply comes behind what the reader's socket holds (~100 KiB on loopback) and at
# most one delivery, not behind a whole send of the broker's (256 KiB: ~300 KiB went ahead).
MOST_BYTES_AHEAD_OF_A_HEARTBEAT = 160 * 1024


async def test_a_slow_reader_gets_no_duplicates_and_its_heartbeats_answered(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    fast = RecordingListener()
    slow = SlowReader(MESSAGES)
    async with running_broker(tmp_path) as broker:
        # A watermark this high puts every message in flight to the slow reader at once.
        await broker.registry.put_bindings("slow", "t", [Binding.direct("t", "x", watermark=MESSAGES)])
        async with (
            Consumer(registry, group="fast", bindings=[Binding.direct("t", "x")], listener=fast),
            Producer(registry, group="p", topics=["t"]) as producer,
            trio.open_nursery() as nursery,
        ):
            await wait_until(lambda: len(broker.router.bindings) == 2, what="both bindings")
            nursery.start_soon(slow.run, broker.address, "slow")
            await wait_until(lambda: "slow" in broker.groups.groups(), what="the slow consumer")
            results = await producer.send_many([Message("t", "x", b"x" * 1024) for _ in range(MESSAGES)])
            assert all(result.ok for result in results), "every send stored while the slow one lags"
            await wait_until(lambda: len(fast.acked) == MESSAGES, timeout=30, what="the fast group served")
            assert len(slow.deliveries) < MESSAGES, "the fast group did not wait for the slow one"
            await wait_until(
                lambda: len(slow.deliveries) >= MESSAGES, timeout=60, what="the slow one, slowly"
            )
    ids = [message_id for message_id, _ in slow.deliveries]
    assert len(set(ids)) == len(ids) == MESSAGES, "no duplicates while it was merely slow"
    assert {count for _, count in slow.deliveries} == {"1"}
    assert broker.events.total("timeout") == 0
    assert len(slow.heartbeat_waits) >= 10, "heartbeats answered all the while"
    assert max(slow.bytes_ahead_of_heartbeats) < MOST_BYTES_AHEAD_OF_A_HEARTBEAT, (
        slow.bytes_ahead_of_heartbeats
    )
