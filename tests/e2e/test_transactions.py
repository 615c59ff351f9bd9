"""Two-phase commit: delivered if and only if the producer's local transaction committed."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from kiteq import Binding, CheckMessageListener, Consumer, Message, Producer, TxStatus
from kiteq.server.admin.dlq import DeadFilter
from kiteq.server.tx.decisions import apply_decision
from tests.faults.report import duplicates, record
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.procs.runner import ClientProcess

TX_FAST = {"tx_scan_interval": 0.2, "tx_check_after": 0.3, "tx_check_timeout": 1.0}
DELIVERY_FAST = {"recover_interval": 0.05, "retry_base": 0.1}


class LocalTxFailed(Exception):
    pass


async def test_commit_delivers_once_rollback_never(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    a, b = RecordingListener(), RecordingListener()
    async with (
        running_broker(tmp_path, tx=TX_FAST, delivery=DELIVERY_FAST) as broker,
        Consumer(registry, group="a", bindings=[Binding.fanout("t")], listener=a),
        Consumer(registry, group="b", bindings=[Binding.direct("t", "x")], listener=b),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 2)

        async def commit(message: Message) -> bool:
            return True

        async def roll_back(message: Message) -> bool:
            return False

        async def explode(message: Message) -> bool:
            raise LocalTxFailed("db down")

        committed = Message("t", "x", b"paid")
        assert await producer.send_tx(committed, commit) is TxStatus.COMMIT
        rolled = Message("t", "x", b"cancelled")
        assert await producer.send_tx(rolled, roll_back) is TxStatus.ROLLBACK
        raised = Message("t", "x", b"crashed")
        with pytest.raises(LocalTxFailed):
            await producer.send_tx(raised, explode)
        await wait_until(lambda: a.acked[committed.message_id] == 1 and b.acked[committed.message_id] == 1)
        scans = broker.backscan.scans
        await wait_until(lambda: broker.backscan.scans >= scans + 3, what="three more back-scans")
    delivered = {m.message_id for m in a.deliveries + b.deliveries}
    assert delivered == {committed.message_id}
    assert a.acked[committed.message_id] == 1 and b.acked[committed.message_id] == 1
    assert broker.events.total("rolled_back") == 2 and broker.events.total("committed") == 1


async def test_uncommitted_message_is_never_delivered(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path, tx={"tx_scan_interval": 60.0}, delivery=DELIVERY_FAST) as broker,
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        pending = Message("t", "x", b"wait", commit=False)
        await producer.send(pending)
        passes = broker.recover.passes
        await wait_until(lambda: broker.recover.passes >= passes + 3, what="three recover passes")
        assert listener.deliveries == []
        entity = await broker.store.get(pending.message_id)
        assert entity is not None and not entity.commit


@pytest.mark.parametrize(("answer", "delivered"), [("commit", True), ("rollback", False)])
async def test_killed_producer_is_answered_by_a_new_one(tmp_path: Path, answer: str, delivered: bool) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path, tx=TX_FAST, delivery=DELIVERY_FAST) as broker,
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
        trio.open_nursery() as nursery,
    ):
        first = await nursery.start(
            ClientProcess("tx_producer", "--registry", registry, "--group", "pay", "--send", "3").run
        )
        await wait_until(lambda: len(first.words("stored")) == 3, what="three store acks")
        first.kill()
        ids = set(first.words("stored"))
        second = await nursery.start(
            ClientProcess("tx_producer", "--registry", registry, "--group", "pay", "--answer", answer).run
        )
        await wait_until(lambda: set(second.words("checked")) >= ids, what="checks reaching the new producer")
        if delivered:
            await wait_until(lambda: listener.acked_ids == ids, what="committed messages delivered")
            record(
                "producer SIGKILL between store ack and decision",
                len(ids),
                0,
                duplicates(listener.deliveries),
            )
        else:
            await wait_until(lambda: broker.events.total("rolled_back") == 3, what="rollbacks applied")
            scans = broker.backscan.scans
            await wait_until(lambda: broker.backscan.scans >= scans + 2, what="two more back-scans")
            assert listener.deliveries == []
        second.kill()


class AlwaysUnknown(CheckMessageListener):
    def __init__(self) -> None:
        self.asked = 0

    async def check(self, message: Message) -> TxStatus:
        self.asked += 1
        return TxStatus.UNKNOWN


async def test_unknown_fifteen_times_dead_letters_then_redrive_delivers(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener, checker = RecordingListener(), AlwaysUnknown()
    tx = {**TX_FAST, "tx_scan_interval": 0.05, "tx_check_after": 0.05}
    async with (
        running_broker(tmp_path, tx=tx, delivery=DELIVERY_FAST) as broker,
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
        Producer(registry, group="p", topics=["t"], check_listener=checker) as producer,
    ):
        message = Message("t", "x", b"undecided", commit=False)
        await producer.send(message)
        await wait_until(lambda: broker.events.total("dead_lettered") == 1, timeout=20, what="tx-unresolved")
        dead = await broker.store.get(message.message_id)
        assert dead is not None and dead.dead_reason == "tx-unresolved"
        assert checker.asked == 15
        assert listener.deliveries == []
        assert await broker.dead_letters.redrive(DeadFilter(message_id=message.message_id)) == 1
        await wait_until(lambda: listener.acked[message.message_id] == 1, what="delivery after redrive")


async def test_producer_without_check_listener_answers_unknown(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with (
        running_broker(tmp_path, tx=TX_FAST, server={"topics": ["t"]}) as broker,
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        message = Message("t", "x", b"?", commit=False)
        await producer.send(message)
        await wait_until(lambda: broker.events.total("tx_checked") >= 4, what="checks answered")
        entity = await broker.store.get(message.message_id)
        assert entity is not None and not entity.commit and entity.deliver_count >= 2


async def test_commit_and_rollback_race_exactly_one_wins(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path, delivery=DELIVERY_FAST) as broker,
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        outcomes = {}
        for i in range(40):
            message = Message("t", "x", f"race {i}".encode(), commit=False)
            await producer.send(message)
            results: dict[TxStatus, bool] = {}

            async def decide(
                status: TxStatus,
                message_id: str = message.message_id,
                results: dict[TxStatus, bool] = results,
            ) -> None:
                # As Broker.decide does: a message already rolled back is gone, and loses.
                entity = await broker.store.get(message_id)
                results[status] = entity is not None and await apply_decision(
                    broker.store, broker.dispatcher, broker.events, entity, status
                )

            async with trio.open_nursery() as nursery:
                first, second = (
                    (TxStatus.COMMIT, TxStatus.ROLLBACK) if i % 2 else (TxStatus.ROLLBACK, TxStatus.COMMIT)
                )
                nursery.start_soon(decide, first)
                nursery.start_soon(decide, second)
            assert sorted(results.values()) == [False, True], results
            outcomes[message.message_id] = results[TxStatus.COMMIT]
        winners = {mid for mid, committed in outcomes.items() if committed}
        await wait_until(lambda: listener.acked_ids == winners, what="only the committed ones delivered")
        passes = broker.recover.passes
        await wait_until(lambda: broker.recover.passes >= passes + 3, what="three recover passes")
        assert {m.message_id for m in listener.deliveries} == winners
