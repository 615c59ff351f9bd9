"""IdempotentListener: redelivered messages take effect once, against a real broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    select,
)

from kiteq import Binding, Consumer, Message, MessageListener, Producer, sync
from kiteq.client.idempotent import IdempotentListener
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until

DELIVERY_FAST = {"recover_interval": 0.05, "retry_base": 0.05, "retry_jitter": "none"}

metadata = MetaData()
ledger = Table("ledger", metadata, Column("message_id", String(32)), Column("amount", Integer))


class LostAck(MessageListener):
    """Runs the wrapped listener, then fails every first delivery: the work is done, the ack lost."""

    def __init__(self, inner: MessageListener) -> None:
        self.inner = inner

    async def on_message(self, message: Message) -> bool:
        ok = await self.inner.on_message(message)
        if message.deliver_count == 1:
            raise RuntimeError("crashed after the work, before the ack")
        return ok


def app_database(tmp_path: Path) -> Engine:
    engine = create_engine(f"sqlite:///{tmp_path}/app.sqlite")
    metadata.create_all(engine)
    return engine


def apply_payment(message: Message, connection: Connection) -> bool:
    connection.execute(ledger.insert(), {"message_id": message.message_id, "amount": int(message.body)})
    return True


def ledger_totals(engine: Engine) -> tuple[int, int]:
    with engine.connect() as connection:
        rows, total = connection.execute(select(func.count(), func.sum(ledger.c.amount))).one()
    return rows, total or 0


async def send_payments(registry: str, count: int) -> set[str]:
    async with Producer(registry, group="bank", topics=["pay"]) as producer:
        return {await producer.send_string("pay", "deposit", str(i + 1)) for i in range(count)}


async def test_every_message_delivered_twice_takes_effect_once(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    engine = app_database(tmp_path)
    idempotent = IdempotentListener(apply_payment, engine, scope="ledger-svc")
    async with (
        running_broker(tmp_path, delivery=DELIVERY_FAST) as broker,
        Consumer(
            registry,
            group="ledger-svc",
            bindings=[Binding.direct("pay", "deposit")],
            listener=LostAck(idempotent),
        ),
    ):
        await wait_until(lambda: len(broker.router.bindings) == 1)
        ids = await send_payments(registry, 20)
        await wait_until(lambda: broker.events.total("acked") == 20, what="the redeliveries acked")
        assert broker.events.total("nacked") == 20, "every message came back once"
    assert (idempotent.processed, idempotent.skipped) == (20, 20)
    assert ledger_totals(engine) == (20, sum(range(1, 21)))
    assert all(idempotent.seen(message_id) for message_id in ids)


async def test_declined_or_failed_work_rolls_back_with_the_id_through_the_sync_consumer(
    tmp_path: Path,
) -> None:
    registry = registry_uri(tmp_path)
    engine = app_database(tmp_path)

    def flaky(message: Message, connection: Connection) -> bool:
        apply_payment(message, connection)
        if message.deliver_count == 1:
            return False  # declined after writing: the write and the id roll back together
        if message.deliver_count == 2:
            raise RuntimeError("failed after writing")
        return True

    idempotent = IdempotentListener(flaky, engine)
    async with running_broker(tmp_path, delivery=DELIVERY_FAST) as broker:
        consumer = await trio.to_thread.run_sync(
            lambda: sync.Consumer(
                registry, group="ledger-svc", bindings=[Binding.direct("pay", "deposit")], listener=idempotent
            )
        )
        await wait_until(lambda: len(broker.router.bindings) == 1)
        await send_payments(registry, 5)
        await wait_until(lambda: consumer.acked == 5, what="third deliveries acked")
        await trio.to_thread.run_sync(consumer.close)
        assert broker.events.total("nacked") == 10
    assert (idempotent.processed, idempotent.skipped) == (5, 0)
    assert ledger_totals(engine) == (5, 15)


async def test_wrapping_an_async_listener_skips_redeliveries_after_its_ack(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    inner = RecordingListener()
    idempotent = IdempotentListener(inner, f"sqlite:///{tmp_path}/processed.sqlite")
    async with (
        running_broker(tmp_path, delivery=DELIVERY_FAST) as broker,
        Consumer(
            registry, group="g", bindings=[Binding.direct("pay", "deposit")], listener=LostAck(idempotent)
        ),
    ):
        await wait_until(lambda: len(broker.router.bindings) == 1)
        ids = await send_payments(registry, 5)
        await wait_until(lambda: broker.events.total("acked") == 5)
    assert inner.acked_ids == ids and max(inner.acked.values()) == 1
    assert (idempotent.processed, idempotent.skipped) == (5, 5)


def test_prune_forgets_old_ids_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listener = IdempotentListener(lambda message, connection: True, f"sqlite:///{tmp_path}/p.sqlite")
    old, new = Message("t", "x", b""), Message("t", "x", b"")
    monkeypatch.setattr(time, "time", lambda: 1_000.0)
    assert trio.run(listener.on_message, old)
    monkeypatch.undo()
    assert trio.run(listener.on_message, new)
    assert listener.prune(older_than=3600) == 1
    assert not listener.seen(old.message_id) and listener.seen(new.message_id)
