"""A broker killed or restarted on its file store: nothing acked is lost, decisions still apply."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from kiteq import Binding, CheckMessageListener, Consumer, Message, Producer, TxStatus
from tests.faults.report import duplicates, record
from tests.faults.resend import send_until_stored
from tests.helpers import RecordingListener, registry_uri, wait_until
from tests.procs.broker import BrokerProcess

pytestmark = pytest.mark.faults

FAST = (
    "--retry-base",
    "0.1",
    "--tx-scan-interval",
    "0.3",
    "--tx-check-after",
    "0.5",
    "--deliver-timeout",
    "2",
)


async def test_sigkill_mid_load_loses_nothing_acked(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    broker = BrokerProcess(
        tmp_path, registry, extra=(*FAST, "--delivery-log", str(tmp_path / "delivery.log"))
    )
    await broker.start()
    groups = {"ledger": RecordingListener(), "mailer": RecordingListener()}
    acked: list[str] = []
    try:
        async with (
            Consumer(registry, group="ledger", bindings=[Binding.fanout("pay")], listener=groups["ledger"]),
            Consumer(
                registry,
                group="mailer",
                bindings=[Binding.direct("pay", "ok", watermark=20)],
                listener=groups["mailer"],
            ),
            Producer(registry, group="shop", topics=["pay"], send_timeout=2) as producer,
        ):
            await broker.wait_bindings(2)
            killed = False
            for i in range(600):
                message = Message("pay", "ok", f"order {i}".encode())
                await send_until_stored(producer, message)
                acked.append(message.message_id)
                if i == 300 and not killed:
                    assert await broker.kill() == -9
                    killed = True
                    await broker.start()
            try:
                await wait_until(
                    lambda: all(set(acked) <= g.acked_ids for g in groups.values()),
                    timeout=60,
                    what="every acked message acked by every bound group",
                )
            except AssertionError:
                missing = {name: len(set(acked) - g.acked_ids) for name, g in groups.items()}
                raise AssertionError(f"missing acks per group: {missing}") from None
    finally:
        await broker.stop()
    for name, listener in groups.items():
        extra = duplicates(listener.deliveries)
        record(f"broker SIGKILL mid-load ({name})", len(acked), len(set(acked) - listener.acked_ids), extra)
        assert extra <= 100, f"{name}: {extra} duplicates is more than the crash explains"


async def test_restart_resumes_unfinished_deliveries_only_to_groups_that_did_not_ack(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    broker = BrokerProcess(tmp_path, registry, extra=FAST)
    await broker.start()
    early, late = RecordingListener(), RecordingListener()
    try:
        async with Consumer(registry, group="early", bindings=[Binding.direct("t", "x")], listener=early):
            async with Producer(registry, group="p", topics=["t"]) as producer:
                await producer.registry.put_bindings("late", "t", [Binding.direct("t", "x")])
                await broker.wait_bindings(2)
                ids = {
                    r.message_id
                    for r in await producer.send_many([Message("t", "x", b"m") for _ in range(100)])
                }
            await wait_until(lambda: early.acked_ids == ids, what="the online group")
            assert await broker.stop() == 0
            before = len(early.deliveries)
            await broker.start()
            async with Consumer(registry, group="late", bindings=[Binding.direct("t", "x")], listener=late):
                await wait_until(
                    lambda: late.acked_ids == ids, timeout=30, what="the offline group after restart"
                )
                await trio.sleep(1.0)
            assert len(early.deliveries) == before, "nothing redelivered to the group that had acked"
    finally:
        await broker.stop()


class CommitAll(CheckMessageListener):
    def __init__(self) -> None:
        self.asked: set[str] = set()

    async def check(self, message: Message) -> TxStatus:
        self.asked.add(message.message_id)
        return TxStatus.COMMIT


async def test_tx_decision_and_backscan_survive_a_restart(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    broker = BrokerProcess(tmp_path, registry, extra=FAST)
    await broker.start()
    listener, checker = RecordingListener(), CommitAll()
    try:
        async with (
            Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
            Producer(registry, group="p", topics=["t"], check_listener=checker) as producer,
        ):
            await broker.wait_bindings(1)

            async def restart_then_commit(message: Message) -> bool:
                assert await broker.stop() == 0
                await broker.start()
                return True

            decided = Message("t", "x", b"decided after restart")
            assert await producer.send_tx(decided, restart_then_commit) is TxStatus.COMMIT
            await wait_until(lambda: decided.message_id in listener.acked_ids, timeout=20, what="the commit")

            forgotten = Message("t", "x", b"left uncommitted", commit=False)
            await producer.send(forgotten)
            assert await broker.stop() == 0
            await broker.start()
            await wait_until(
                lambda: forgotten.message_id in listener.acked_ids,
                timeout=30,
                what="back-scan after restart to commit it",
            )
            assert forgotten.message_id in checker.asked
    finally:
        await broker.stop()
