"""kiteq.sync against a real broker on loopback: the blocking code runs in worker threads."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import trio

from kiteq import AuthError, Binding, Consumer, Message, Producer, SendError, TxStatus, sync
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until

TX_FAST = {"tx_scan_interval": 0.2, "tx_check_after": 0.3, "tx_check_timeout": 1.0}
DELIVERY_FAST = {"recover_interval": 0.05, "retry_base": 0.1, "retry_jitter": "none"}


class LocalTxFailed(Exception):
    pass


async def test_sixteen_threads_send_at_once_through_one_producer(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    threads, each = 16, 50
    async with (
        running_broker(tmp_path) as broker,
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
    ):

        def blocking() -> list[str]:
            start = threading.Barrier(threads)

            def worker(n: int) -> list[str]:
                start.wait()
                return [producer.send_string("t", "x", f"{n}-{i}") for i in range(each)]

            with (
                sync.Producer(registry, group="p", topics=["t"]) as producer,
                ThreadPoolExecutor(threads) as pool,
            ):
                return [mid for ids in pool.map(worker, range(threads)) for mid in ids]

        ids = await trio.to_thread.run_sync(blocking)
        assert len(set(ids)) == threads * each
        assert broker.events.total("stored") == threads * each
        await wait_until(lambda: listener.acked_ids == set(ids), what="all 800 messages acked")
    assert sorted(m.body for m in listener.deliveries) == sorted(
        f"{n}-{i}" for n in range(threads) for i in range(each)
    )


async def test_message_options_strings_bytes_and_fly(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path) as broker,
        Consumer(registry, group="c", bindings=[Binding.fanout("t")], listener=listener),
    ):

        def blocking() -> dict[str, str]:
            with sync.Producer(registry, group="p", topics=["t"]) as producer:
                return {
                    "text": producer.send_string("t", "text", "héllo", properties={"k": "v"}, ttl=60),
                    "bytes": producer.send_bytes("t", "bytes", b"\x00\xff", deliver_limit=3),
                    "fly": producer.send_string("t", "fly", "not stored", fly=True),
                    "many": producer.send_many([Message("t", "many", b"m")])[0].message_id,
                }

        sent_at = time.time()
        ids = await trio.to_thread.run_sync(blocking)
        await wait_until(lambda: listener.acked_ids == set(ids.values()), what="four messages")
        assert broker.events.total("stored") == 3, "the fly message is acked without being stored"
        await wait_until(lambda: broker.events.total("finished") == 4)
        assert (await broker.store.stats()).messages == 0
    by_type = {m.message_type: m for m in listener.deliveries}
    assert by_type["text"].body == "héllo" and by_type["text"].properties == {"k": "v"}
    assert sent_at + 59 <= by_type["text"].expired_time <= time.time() + 61
    assert by_type["bytes"].body == b"\x00\xff" and by_type["bytes"].deliver_limit == 3
    assert by_type["fly"].fly and by_type["fly"].body == "not stored"


async def test_send_tx_runs_local_tx_in_the_calling_thread(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path, tx={"tx_scan_interval": 60.0}, delivery=DELIVERY_FAST) as broker,
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
    ):

        def blocking() -> dict[str, object]:
            caller = threading.get_ident()
            ran_in: list[int] = []

            def local(decision: bool):  # type: ignore[no-untyped-def]
                def run(message: Message) -> bool:
                    ran_in.append(threading.get_ident())
                    return decision

                return run

            def explode(message: Message) -> bool:
                raise LocalTxFailed("db down")

            # No `with`: an explicit close() right after the last send_tx.
            producer = sync.Producer(registry, group="p", topics=["t"])
            committed = Message("t", "x", b"paid")
            rolled_back = Message("t", "x", b"cancelled")
            statuses = [producer.send_tx(committed, local(True)), producer.send_tx(rolled_back, local(False))]
            with pytest.raises(LocalTxFailed):
                producer.send_tx(Message("t", "x", b"crashed"), explode)
            last = Message("t", "x", b"last")
            statuses.append(producer.send_tx(last, local(True)))
            producer.close()
            assert set(ran_in) == {caller}
            return {"statuses": statuses, "committed": {committed.message_id, last.message_id}}

        result = await trio.to_thread.run_sync(blocking)
        assert result["statuses"] == [TxStatus.COMMIT, TxStatus.ROLLBACK, TxStatus.COMMIT]
        await wait_until(lambda: listener.acked_ids == result["committed"], what="the committed messages")
        assert broker.events.total("committed") == 2 and broker.events.total("rolled_back") == 2


async def test_sync_check_listener_answers_the_back_scan(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    asked: list[str] = []

    def check(message: Message) -> TxStatus:
        asked.append(message.message_id)
        return TxStatus.COMMIT

    async with (
        running_broker(tmp_path, tx=TX_FAST, delivery=DELIVERY_FAST),
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
    ):
        producer = await trio.to_thread.run_sync(
            lambda: sync.Producer(registry, group="p", topics=["t"], check_listener=check)
        )
        pending = Message("t", "x", b"undecided", commit=False)
        await trio.to_thread.run_sync(producer.send, pending)  # stored uncommitted: the broker will ask
        await wait_until(lambda: pending.message_id in asked, what="the back-scan's question")
        await wait_until(lambda: listener.acked_ids == {pending.message_id}, what="the checked message")
        await trio.to_thread.run_sync(producer.close)


async def test_errors_surface_typed_in_the_calling_thread(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path, auth={"p": "s3cret"}, server={"topics": ["t"]}):

        def blocking() -> None:
            with pytest.raises(AuthError, match="authentication failed for group 'p'"):
                sync.Producer(registry, group="p", secret="wrong", topics=["t"], connect_timeout=3)
            producer = sync.Producer(registry, group="p", secret="s3cret", topics=["t"])
            with pytest.raises(SendError, match="Invalid MessageId") as caught:
                producer.send(Message("t", "x", b"", message_id="not-a-uuid"))
            assert caught.value.message_id == "not-a-uuid"
            assert producer.send_string("t", "x", "still fine")
            producer.close()
            producer.close()  # idempotent
            with pytest.raises(RuntimeError, match="is closed"):
                producer.send_string("t", "x", "too late")

        await trio.to_thread.run_sync(blocking)


async def test_sync_consumer_with_a_function_and_a_listener_object(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    received: list[tuple[str, str]] = []
    lock = threading.Lock()

    def handle(message: Message) -> bool:
        with lock:
            received.append(("function", message.message_id))
        return True

    class Handler(sync.MessageListener):
        def on_message(self, message: Message) -> bool:
            with lock:
                received.append(("object", message.message_id))
            return message.deliver_count > 1  # nack the first delivery, ack the redelivery

    async with running_broker(tmp_path, delivery=DELIVERY_FAST) as broker:
        by_function, by_object = await trio.to_thread.run_sync(
            lambda: (
                sync.Consumer(registry, group="f", bindings=[Binding.direct("t", "x")], listener=handle),
                sync.Consumer(registry, group="o", bindings=[Binding.direct("t", "x")], listener=Handler()),
            )
        )
        await wait_until(lambda: len(broker.router.bindings) == 2, what="both bindings at the broker")

        def send() -> set[str]:
            with sync.Producer(registry, group="p", topics=["t"]) as producer:
                return {producer.send_string("t", "x", f"m{i}") for i in range(5)}

        ids = await trio.to_thread.run_sync(send)
        await wait_until(lambda: (by_function.acked, by_object.acked) == (5, 5), what="acks from both")
        assert by_object.nacked == 5
        await trio.to_thread.run_sync(by_function.close)
        await trio.to_thread.run_sync(by_object.close)
        assert broker.events.total("acked") == 10
    assert Counter(kind for kind, _ in received) == {"function": 5, "object": 10}
    assert {mid for _, mid in received} == ids


async def test_sync_listeners_run_in_threads_up_to_max_concurrency(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    running, peak, threads = 0, 0, set()
    lock = threading.Lock()

    def slow(message: Message) -> bool:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            threads.add(threading.get_ident())
        time.sleep(0.1)
        with lock:
            running -= 1
        return True

    bindings = [Binding.direct("t", "x", watermark=100)]
    async with running_broker(tmp_path, server={"topics": ["t"]}) as broker:
        consumer = await trio.to_thread.run_sync(
            lambda: sync.Consumer(registry, group="c", bindings=bindings, listener=slow, max_concurrency=4)
        )
        await wait_until(lambda: len(broker.router.bindings) == 1)
        async with Producer(registry, group="p", topics=["t"]) as producer:
            await producer.send_many([Message("t", "x", b"m") for _ in range(20)])
        await wait_until(lambda: consumer.acked == 20)
        assert not consumer.wait(timeout=0), "still consuming"
        await trio.to_thread.run_sync(consumer.close)
        assert consumer.wait(timeout=0), "stopped"
        assert broker.events.total("acked") == 20
    assert peak == 4 and len(threads) >= 4


async def test_sync_message_timeout_nacks_and_the_redelivery_is_acked(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    attempts: list[int] = []

    def sometimes_stuck(message: Message) -> bool:
        attempts.append(message.deliver_count)
        if message.deliver_count == 1:
            time.sleep(1.0)  # the consumer gives up on this thread after 0.2 s
        return True

    async with running_broker(tmp_path, delivery=DELIVERY_FAST, server={"topics": ["t"]}) as broker:
        consumer = await trio.to_thread.run_sync(
            lambda: sync.Consumer(
                registry,
                group="c",
                bindings=[Binding.direct("t", "x")],
                listener=sometimes_stuck,
                message_timeout=0.2,
            )
        )
        await wait_until(lambda: len(broker.router.bindings) == 1)
        async with Producer(registry, group="p", topics=["t"]) as producer:
            await producer.send_string("t", "x", "slow once")
        await wait_until(lambda: consumer.acked == 1, what="the redelivery acked")
        # The consumer counts an ack once handed to its connection; the broker's reader
        # may not have read it yet.
        await wait_until(lambda: broker.events.total("acked") == 1, what="the broker's record of the ack")
        assert consumer.nacked == 1
        assert broker.events.total("nacked") == 1
        await trio.to_thread.run_sync(consumer.close)
    assert attempts == [1, 2]


async def test_sync_consumer_closed_mid_stream_finishes_and_acks_its_listeners(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    bindings = [Binding.direct("t", "x", watermark=20)]
    processed: Counter[str] = Counter()
    running = 0
    lock = threading.Lock()

    def slow(message: Message) -> bool:
        nonlocal running
        with lock:
            running += 1
        time.sleep(0.05)
        with lock:
            processed[message.message_id] += 1
            running -= 1
        return True

    async with (
        running_broker(tmp_path, delivery=DELIVERY_FAST, server={"topics": ["t"]}) as broker,
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        first = await trio.to_thread.run_sync(
            lambda: sync.Consumer(registry, group="g", bindings=bindings, listener=slow, max_concurrency=8)
        )
        await wait_until(lambda: len(broker.router.bindings) == 1)
        ids = {r.message_id for r in await producer.send_many([Message("t", "x", b"m") for _ in range(200)])}
        await wait_until(
            lambda: first.acked >= 20 and running > 0, what="the first consumer busy with listeners running"
        )
        running_at_close = running
        await trio.to_thread.run_sync(first.close)
        assert running_at_close > 0 and running == 0
        assert first.acked == processed.total()
        # The close returns once its last acks are on the wire; the broker reads them on its own time.
        await wait_until(
            lambda: broker.events.total("acked") == first.acked,
            what="the broker to take the closing consumer's acks",
        )
        second = await trio.to_thread.run_sync(
            lambda: sync.Consumer(registry, group="g", bindings=bindings, listener=slow, max_concurrency=32)
        )
        await wait_until(lambda: set(processed) == ids, timeout=20, what="the rest, by the second")
        await trio.to_thread.run_sync(second.close)
        assert broker.events.total("acked") == 200
    assert max(processed.values()) == 1, "no message was processed twice"
