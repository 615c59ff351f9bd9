"""The delivery contract: watermarks, retries with backoff, dead letters, offline groups, sharing, warm-up."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import httpx
import trio

from kiteq import Binding, Consumer, Message, Producer
from kiteq.cli.admin import main as admin_main
from kiteq.server.groups import warmup_weight
from tests.faults.report import record
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.procs.runner import ClientProcess

FAST = {"retry_base": 0.2, "retry_max": 2.0, "recover_interval": 0.05, "deliver_timeout": 2.0}


async def test_slow_group_never_exceeds_its_watermark_and_fast_group_is_not_slowed(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    slow, fast = RecordingListener(delay=0.05), RecordingListener()
    async with (
        running_broker(tmp_path, delivery=FAST) as broker,
        Consumer(registry, group="slow", bindings=[Binding.direct("t", "x", watermark=10)], listener=slow),
        Consumer(registry, group="fast", bindings=[Binding.direct("t", "x")], listener=fast),
    ):
        await wait_until(lambda: len(broker.router.bindings) == 2)
        async with Producer(registry, group="p", topics=["t"]) as producer:
            started = trio.current_time()
            ids = {
                m.message_id for m in await producer.send_many([Message("t", "x", b"m") for _ in range(200)])
            }
            await wait_until(lambda: fast.acked_ids == ids, what="the fast group")
            fast_done = trio.current_time() - started
            assert len(slow.acked) < 150, "the slow group is still far behind when the fast one is done"
            await wait_until(lambda: slow.acked_ids == ids, timeout=30, what="the slow group")
    assert slow.max_running <= 10, f"watermark 10 exceeded: {slow.max_running} in flight"
    assert fast_done < 200 * 0.05 / 10, "the fast group finished well before the slow group could"


async def test_failing_listener_gets_four_deliveries_with_growing_gaps(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener(fail=lambda m: m.deliver_count <= 3)
    options = {**FAST, "retry_base": 0.4, "retry_max": 4.0, "retry_jitter": "none"}
    async with (
        running_broker(tmp_path, delivery=options),
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        message_id = await producer.send(Message("t", "x", b"flaky"))
        await wait_until(lambda: listener.acked[message_id] == 1, timeout=20, what="the fourth delivery")
    times = listener.times[message_id]
    assert len(times) == 4
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] < gaps[1] < gaps[2], f"gaps should grow: {gaps}"
    assert gaps[0] >= 0.4 * 0.9


async def test_always_failing_message_is_dead_lettered_then_redriven(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    healed = False
    listener = RecordingListener(fail=lambda m: not healed)
    async with (
        running_broker(tmp_path, delivery={**FAST, "retry_base": 0.05, "retry_max": 0.1}) as broker,
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        sent_at = time.time()
        message_id = await producer.send(Message("t", "x", b"poison", deliver_limit=3))
        await wait_until(lambda: broker.events.total("dead_lettered") == 1, what="the dead letter")
        assert len(listener.deliveries) == 3
        admin = f"http://{broker.admin_address}"
        listed = await trio.to_thread.run_sync(
            lambda: httpx.get(f"{admin}/dlq", params={"reason": "deliver-limit"}).json()
        )
        assert [d["message_id"] for d in listed] == [message_id]
        assert listed[0]["fail_groups"] == ["c"]
        assert listed[0]["deliver_count"] == 3, "the final round is recorded before dead-lettering"
        assert sent_at <= listed[0]["dead_at"] <= time.time(), "when it was dead-lettered, wall clock"
        healed = True
        code = await trio.to_thread.run_sync(
            admin_main, ["--admin", admin, "dlq", "redrive", "--id", message_id]
        )
        assert code == 0
        await wait_until(lambda: listener.acked[message_id] == 1, what="delivery after redrive")
        assert (await broker.store.stats()).dead == 0


async def test_expired_message_goes_to_the_dead_letter_queue(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener(fail=lambda m: True)
    async with (
        running_broker(tmp_path, delivery=FAST) as broker,
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        message_id = await producer.send(Message("t", "x", b"short-lived", expired_time=int(time.time()) + 2))
        await wait_until(lambda: broker.events.total("dead_lettered") == 1, timeout=10)
        dead = await broker.store.get(message_id)
        assert dead is not None and dead.dead and dead.dead_reason == "expired"


async def test_offline_groups_non_persistent_dropped_persistent_kept(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path, delivery=FAST) as broker:
        await broker.registry.put_bindings("keeper", "t", [Binding.direct("t", "x", persistent=True)])
        await broker.registry.put_bindings("skipper", "t", [Binding.direct("t", "x", persistent=False)])
        await wait_until(lambda: len(broker.router.bindings) == 2)
        async with Producer(registry, group="p", topics=["t"]) as producer:
            ids = {await producer.send(Message("t", "x", f"{i}".encode())) for i in range(5)}
        await wait_until(
            lambda: broker.events.total("dropped") == 5, what="drops for the offline non-persistent group"
        )
        listener = RecordingListener()
        async with Consumer(registry, group="keeper", bindings=[Binding.direct("t", "x")], listener=listener):
            await wait_until(
                lambda: listener.acked_ids == ids, what="the persistent group after it came online"
            )
        await wait_until(lambda: broker.events.total("finished") == 5)
        assert (await broker.store.stats()).messages == 0


async def test_two_consumers_share_and_a_killed_one_loses_nothing(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    survivor = RecordingListener(delay=0.01)
    binding = [Binding.direct("t", "x", watermark=50)]
    async with running_broker(tmp_path, delivery=FAST) as broker, trio.open_nursery() as nursery:
        doomed = await nursery.start(
            ClientProcess("consumer", "--registry", registry, "--group", "g", "--delay", "0.05").run
        )
        await wait_until(lambda: "ready" in doomed.lines, what="the consumer process")
        async with (
            Consumer(registry, group="g", bindings=binding, listener=survivor),
            Producer(registry, group="p", topics=["t"]) as producer,
        ):
            await wait_until(lambda: len(broker.groups.peers("g")) == 2)
            ids = {
                r.message_id for r in await producer.send_many([Message("t", "x", b"w") for _ in range(300)])
            }
            await wait_until(
                lambda: len(doomed.words("acked")) >= 20 and len(survivor.acked) >= 20, what="sharing"
            )
            doomed.kill()
            await wait_until(
                lambda: survivor.acked_ids | set(doomed.words("acked")) == ids,
                timeout=30,
                what="every message acked by the group",
            )
            await wait_until(lambda: broker.events.total("finished") == 300)
        acked_by_group = survivor.acked_ids | set(doomed.words("acked"))
        record(
            "consumer SIGKILL, deliveries in flight",
            len(ids),
            len(ids - acked_by_group),
            len(survivor.deliveries) + len(doomed.words("acked")) - len(ids),
        )
        assert broker.events.total("nacked") > 0, (
            "the killed consumer's deliveries failed and were redelivered"
        )


async def test_warming_connection_gets_a_smaller_share_at_first(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    veteran, newcomer = RecordingListener(delay=0.005), RecordingListener(delay=0.005)
    binding = [Binding.direct("t", "x", watermark=4)]
    async with (
        running_broker(tmp_path, delivery=FAST) as broker,
        Consumer(registry, group="g", bindings=binding, listener=veteran),
        Consumer(registry, group="g", bindings=binding, listener=newcomer, warmup_seconds=60),
    ):
        await wait_until(lambda: len(broker.groups.peers("g")) == 2)
        async with Producer(registry, group="p", topics=["t"]) as producer:
            await producer.send_many([Message("t", "x", b"w") for _ in range(400)])
            await wait_until(lambda: len(veteran.acked) + len(newcomer.acked) == 400, timeout=30)
    assert len(newcomer.acked) < len(veteran.acked) / 3, (len(newcomer.acked), len(veteran.acked))
    assert len(newcomer.acked) > 0, "a warming connection still gets some traffic"


async def test_even_share_once_warm(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    a, b = RecordingListener(delay=0.005), RecordingListener(delay=0.005)
    binding = [Binding.direct("t", "x", watermark=4)]
    async with (
        running_broker(tmp_path, delivery=FAST) as broker,
        Consumer(registry, group="g", bindings=binding, listener=a),
        Consumer(registry, group="g", bindings=binding, listener=b, warmup_seconds=1),
    ):
        await wait_until(
            lambda: all(warmup_weight(c, time.time()) == 1.0 for c in broker.connections if c.group == "g"),
            what="the newcomer warmed up",
        )
        async with Producer(registry, group="p", topics=["t"]) as producer:
            await producer.send_many([Message("t", "x", b"w") for _ in range(400)])
            await wait_until(lambda: len(a.acked) + len(b.acked) == 400, timeout=30)
    assert abs(len(a.acked) - len(b.acked)) < 400 * 0.3, (len(a.acked), len(b.acked))


async def test_only_connections_awaiting_answers_are_timed_out(tmp_path: Path) -> None:
    """The expiry tick visits the connections with deliveries pending, not every connection:
    idle ones, and producers, cost it nothing."""
    registry = registry_uri(tmp_path)
    listener = RecordingListener(delay=0.3)
    binding = [Binding.direct("t", "x", watermark=4)]
    async with (
        running_broker(tmp_path, delivery=FAST) as broker,
        Consumer(registry, group="g", bindings=binding, listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        await wait_until(lambda: len(broker.groups.peers("g")) == 1)
        assert not broker.awaiting
        await producer.send_many([Message("t", "x", b"w") for _ in range(8)])
        await wait_until(
            lambda: {connection.group for connection in broker.awaiting} == {"g"},
            what="the consumer's connection, awaiting its acks",
        )
        await wait_until(lambda: len(listener.acked) == 8, timeout=30)
        await wait_until(lambda: not broker.awaiting, what="all answered: no connection to visit")
