"""Delayed messages over the wire: the raw `kiteq.deliverAt` property, as any KiteQ client
can send it, and the project's `send(delay=...)` / `cancel`.

Times are the wall clock's (the broker schedules by it); delays are a second or two so
the suite stays quick. "Not before its time" is checked by listening until that time.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from kiteq import Binding, CancelError, Consumer, Message, Producer
from kiteq.server.broker import Broker
from protocol import Cmd, TxStatus, pb
from protocol.schedule import DELIVER_AT, format_deliver_at
from tests.helpers import RecordingListener, bind_direct, registry_uri, running_broker, wait_until
from tests.integration.admin.test_trace import kiteq_admin
from tests.procs.broker import BrokerProcess
from tests.wire import RawPeer, header

LATE_BOUND = 1.5  # seconds after its time by which a lone delayed message must arrive


def delayed_header(group: str, at: float, *, commit: bool = True) -> pb.Header:
    """A header as KiteQ's Go client fills it, with the delivery time among its properties."""
    message_header = header(group, commit=commit)
    message_header.properties.add(key=DELIVER_AT, value=format_deliver_at(at))
    return message_header


@contextlib.asynccontextmanager
async def bound_peers(tmp_path: Path, **options: Any) -> AsyncIterator[tuple[Broker, RawPeer, RawPeer]]:
    """A running broker with group "c" bound to t/x, and raw peers of "c" (consumer) and "p"."""
    async with running_broker(tmp_path, **options) as broker:
        await bind_direct(broker, "c")
        consumer = await RawPeer.login(broker.address, "c")
        producer = await RawPeer.login(broker.address, "p")
        yield broker, consumer, producer


async def nothing_delivered_until(consumer: RawPeer, deadline: float) -> None:
    """Listen until wall-clock `deadline`: no delivery may arrive before it."""
    with trio.move_on_after(max(0.0, deadline - time.time() - 0.05)):
        _, message = await consumer.receive(Cmd.BYTES_MESSAGE, timeout=3600)
        raise AssertionError(f"{message.header.messageId} delivered {deadline - time.time():.3f} s early")


async def received_at(consumer: RawPeer, timeout: float = 10.0) -> tuple[str, float]:
    frame, message = await consumer.receive(Cmd.BYTES_MESSAGE, timeout=timeout)
    arrived = time.time()
    ack = pb.DeliverAck(
        messageId=message.header.messageId, topic="t", messageType="x", groupId="p", status=True
    )
    await consumer.send(frame.opaque, Cmd.DELIVER_ACK, ack)
    return message.header.messageId, arrived


async def test_a_raw_deliver_at_is_acked_at_once_and_delivered_at_its_time(tmp_path: Path) -> None:
    async with bound_peers(tmp_path, store=f"file://{tmp_path}/store") as (broker, consumer, producer):
        due = time.time() + 1.5
        later, sooner = delayed_header("p", due + 0.5), delayed_header("p", due)
        sent = time.time()
        for message_header in (later, sooner):
            ack = await producer.produce(message_header)
            assert ack.status, ack.feedback
        assert time.time() - sent < 1.0, "stored and acked at once, not when due"
        scheduled = (await broker.stats())["scheduled"]
        assert scheduled["total"] == 2 and scheduled["by_topic"] == {"t": 2}

        await nothing_delivered_until(consumer, due)
        first, first_at = await received_at(consumer)
        second, second_at = await received_at(consumer)
        assert (first, second) == (sooner.messageId, later.messageId)
        assert due <= first_at < due + LATE_BOUND
        assert due + 0.5 <= second_at < due + 0.5 + LATE_BOUND


async def test_a_past_deliver_at_is_delivered_at_once(tmp_path: Path) -> None:
    async with bound_peers(tmp_path) as (_, consumer, producer):
        past = delayed_header("p", time.time() - 60)
        assert (await producer.produce(past)).status
        message_id, _ = await received_at(consumer, timeout=2.0)
        assert message_id == past.messageId


@pytest.mark.parametrize(
    ("value", "expired", "refusal"),
    [
        ("tomorrow", -1, "decimal digits"),
        ("-5", -1, "decimal digits"),
        (str(int((time.time() + 3 * 365 * 86400) * 1000)), -1, "max_delay"),
        (str(int((time.time() + 7200) * 1000)), int(time.time() + 3600), "expiredTime is before"),
    ],
)
async def test_a_bad_deliver_at_is_refused_with_a_reason(
    tmp_path: Path, value: str, expired: int, refusal: str
) -> None:
    async with running_broker(tmp_path, server={"topics": ["t"]}) as broker:
        producer = await RawPeer.login(broker.address, "p")
        message_header = header("p")
        message_header.expiredTime = expired
        message_header.properties.add(key=DELIVER_AT, value=value)
        ack = await producer.produce(message_header)
        assert not ack.status and refusal in ack.feedback, ack.feedback
        assert await broker.store.get(message_header.messageId) is None


async def test_only_the_producer_group_cancels_and_a_cancelled_message_never_comes(tmp_path: Path) -> None:
    async with bound_peers(tmp_path, store=f"file://{tmp_path}/store") as (broker, consumer, producer):
        tenant = await RawPeer.login(broker.address, "x")
        due = time.time() + 1.0
        cancelled, kept = delayed_header("p", due), delayed_header("p", due)
        for message_header in (cancelled, kept):
            assert (await producer.produce(message_header)).status

        async def cancel(peer: RawPeer, message_header: pb.Header) -> pb.MessageStoreAck:
            opaque = peer.next_opaque()
            packet = pb.TxACKPacket(header=message_header, status=TxStatus.ROLLBACK, feedback="")
            await peer.send(opaque, Cmd.CANCEL, packet)
            frame, ack = await peer.receive(Cmd.MESSAGE_STORE_ACK)
            assert frame.opaque == opaque
            return ack

        refused = await cancel(tenant, cancelled)
        assert not refused.status and "only its producer group" in refused.feedback
        assert (await cancel(producer, cancelled)).status
        assert "no such message" in (await cancel(producer, cancelled)).feedback
        assert await broker.store.get(cancelled.messageId) is None

        message_id, _ = await received_at(consumer)
        assert message_id == kept.messageId
        too_late = await cancel(producer, kept)
        assert not too_late.status, "a delivered message cannot be cancelled"
        await nothing_delivered_until(consumer, time.time() + 1.0)


async def test_deliver_at_is_absolute_for_a_transaction(tmp_path: Path) -> None:
    async with bound_peers(tmp_path, store=f"file://{tmp_path}/store") as (_, consumer, producer):
        due = time.time() + 1.5
        early_commit = delayed_header("p", due, commit=False)
        late_commit = delayed_header("p", time.time() + 0.3, commit=False)
        for message_header in (early_commit, late_commit):
            assert (await producer.produce(message_header)).status
        commit = pb.TxACKPacket(header=early_commit, status=TxStatus.COMMIT, feedback="")
        await producer.send(0, Cmd.TX_ACK, commit)  # committed before its time: waits for it
        await nothing_delivered_until(consumer, time.time() + 0.5)
        # Committed after its time: delivered at commit.
        committed_at = time.time()
        await producer.send(
            0, Cmd.TX_ACK, pb.TxACKPacket(header=late_commit, status=TxStatus.COMMIT, feedback="")
        )
        message_id, arrived = await received_at(consumer)
        assert message_id == late_commit.messageId and arrived - committed_at < LATE_BOUND
        await nothing_delivered_until(consumer, due)
        message_id, arrived = await received_at(consumer)
        assert message_id == early_commit.messageId and arrived >= due


async def test_the_client_schedules_and_cancels(tmp_path: Path) -> None:
    async with running_broker(tmp_path, store=f"file://{tmp_path}/store") as broker:
        registry = broker.config.server.registry
        listener = RecordingListener()
        async with (
            Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
            Producer(registry, group="p", topics=["t"]) as producer,
        ):
            await wait_until(lambda: broker.groups.has_live("c"), what="the consumer")
            kept, dropped = Message("t", "x", b"kept"), Message("t", "x", b"dropped")
            sent = time.time()
            await producer.send(kept, delay=1.0)
            await producer.send(dropped, delay=1.0)
            await producer.cancel(dropped.message_id)
            with pytest.raises(CancelError, match="no such message"):
                await producer.cancel(dropped.message_id)
            await wait_until(lambda: kept.message_id in listener.acked_ids, timeout=5, what="the kept one")
            assert time.time() - sent >= 1.0
            assert listener.deliveries[0].deliver_at == pytest.approx(sent + 1.0, abs=0.1)
            assert dropped.message_id not in listener.acked_ids
            with pytest.raises(ValueError, match="not both"):
                await producer.send(Message("t", "x", b"?"), delay=1, deliver_at=time.time())


async def test_a_schedule_survives_kill_9_and_nothing_comes_early(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    broker = BrokerProcess(tmp_path, registry, extra=("--topic", "t"))
    await broker.start()
    try:
        producer = await RawPeer.login(broker.address, "p")
        due = time.time() + 3.0
        message_header = delayed_header("p", due)
        assert (await producer.produce(message_header)).status
        await producer.aclose()
        assert await broker.kill() == -9
        await broker.start()
        listener = RecordingListener()
        async with Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener):
            await wait_until(
                lambda: message_header.messageId in listener.acked_ids, timeout=10, what="the delivery"
            )
        arrived = time.time()
        assert arrived >= due, f"delivered {due - arrived:.2f} s early after the restart"
        assert arrived < due + 5.0
    finally:
        await broker.stop()


async def test_operators_see_and_cancel_scheduled_messages(tmp_path: Path) -> None:
    """`/stats`, `/metrics` and `kiteq-admin message list|cancel` run as a user runs them."""
    async with running_broker(tmp_path, server={"topics": ["t"], "admin_token": "s3cret"}) as broker:
        url = f"http://{broker.admin_address}"
        producer = await RawPeer.login(broker.address, "p")
        due = time.time() + 3600
        cancelled, kept = delayed_header("p", due), delayed_header("p", due + 60)
        for message_header in (cancelled, kept):
            assert (await producer.produce(message_header)).status

        listed = await kiteq_admin("--admin", url, "message", "list", "--state", "scheduled", "--json")
        assert listed.returncode == 0, listed.stderr
        ids = {row["message_id"] for row in json.loads(listed.stdout)["messages"]}
        assert ids == {cancelled.messageId, kept.messageId}
        async with httpx.AsyncClient(base_url=url) as admin:
            metrics = (await admin.get("/metrics")).text
            assert 'kiteq_scheduled_messages{topic="t"} 2.0' in metrics
            refused = await admin.post(f"/messages/{cancelled.messageId}/cancel", json={})
            assert refused.status_code == 401, "a mutation needs the admin token"

        done = await kiteq_admin(
            "--admin", url, "--token", "s3cret", "message", "cancel", cancelled.messageId
        )
        assert done.returncode == 0 and "will not be delivered" in done.stdout, done.stderr
        again = await kiteq_admin(
            "--admin", url, "--token", "s3cret", "message", "cancel", cancelled.messageId
        )
        assert again.returncode == 1 and "no such message" in again.stderr
        stats = await kiteq_admin("--admin", url, "stats")
        assert "scheduled" in stats.stdout and "1 (t 1)" in stats.stdout, stats.stdout
        assert await broker.store.get(cancelled.messageId) is None
        assert await broker.store.get(kept.messageId) is not None
