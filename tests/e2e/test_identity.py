"""Identity and authorization over the wire: a tenant acts only as the group it proved.

Every hostile step is sent as raw frames (tests/wire.py), the way a foreign or
malicious client would, not through the project's client library.
"""

from __future__ import annotations

from pathlib import Path

import structlog.testing

from kiteq.logging import configure_logging
from kiteq.registry.bindings import Binding
from protocol import Cmd, TxStatus, pb
from tests.helpers import bind_direct, running_broker, wait_until
from tests.wire import RawPeer, header

SECRETS = {"p": "p-secret", "x": "x-secret", "c": "c-secret"}


def decision(message_header: pb.Header, status: TxStatus) -> pb.TxACKPacket:
    return pb.TxACKPacket(header=message_header, status=status, feedback="")


async def test_a_tenant_cannot_commit_or_roll_back_another_groups_transaction(tmp_path: Path) -> None:
    configure_logging("info")
    async with running_broker(tmp_path, store=f"file://{tmp_path}/store", auth=SECRETS) as broker:
        await bind_direct(broker, "c")
        consumer = await RawPeer.login(broker.address, "c", "c-secret")
        producer = await RawPeer.login(broker.address, "p", "p-secret")
        tenant = await RawPeer.login(broker.address, "x", "x-secret")
        first, second = header("p", commit=False), header("p", commit=False)
        assert (await producer.produce(first)).status and (await producer.produce(second)).status

        with structlog.testing.capture_logs() as logs:
            # As KiteQ's Go client sends a decision: fire-and-forget, opaque 0.
            await tenant.send(0, Cmd.TX_ACK, decision(first, TxStatus.COMMIT))
            await tenant.send(0, Cmd.TX_ACK, decision(second, TxStatus.ROLLBACK))
            await wait_until(lambda: broker.refusals.totals.get("tx.wrong_group") == 2, what="both refused")
        for message_header in (first, second):
            entity = await broker.store.get(message_header.messageId)
            assert entity is not None and not entity.commit, "neither decision was applied"
        refused = [entry for entry in logs if entry["event"] == "tx.wrong_group"]
        assert len(refused) == 1, "logged once, then counted"
        assert (refused[0]["group"], refused[0]["producer_group"]) == ("'x'", "'p'")

        # The producer's own decisions still decide: the rollback the tenant tried did not happen.
        await producer.send(0, Cmd.TX_ACK, decision(first, TxStatus.COMMIT))
        await producer.send(0, Cmd.TX_ACK, decision(second, TxStatus.COMMIT))
        delivered = set()
        for _ in range(2):
            frame, message = await consumer.receive(Cmd.BYTES_MESSAGE)
            delivered.add(message.header.messageId)
            ack = pb.DeliverAck(
                messageId=message.header.messageId, topic="t", messageType="x", groupId="p", status=True
            )
            await consumer.send(frame.opaque, Cmd.DELIVER_ACK, ack)
        assert delivered == {first.messageId, second.messageId}


async def test_a_producer_cannot_send_as_another_group(tmp_path: Path) -> None:
    async with running_broker(tmp_path, auth=SECRETS, server={"topics": ["t"]}) as broker:
        tenant = await RawPeer.login(broker.address, "x", "x-secret")
        forged = header("p", commit=False)
        ack = await tenant.produce(forged)
        assert not ack.status and ack.messageId == forged.messageId
        assert "'p'" in ack.feedback and "'x'" in ack.feedback, ack.feedback
        assert await broker.store.get(forged.messageId) is None
        assert (await broker.store.stats()).uncommitted == 0, "nothing for the back-scan to ask p about"
        own = header("x")
        assert (await tenant.produce(own)).status, "the connection goes on serving its own group"


async def test_a_deliver_ack_counts_only_on_the_connection_the_delivery_went_to(tmp_path: Path) -> None:
    async with running_broker(tmp_path, auth=SECRETS) as broker:
        await bind_direct(broker, "c")
        receiver = await RawPeer.login(broker.address, "c", "c-secret")
        producer = await RawPeer.login(broker.address, "p", "p-secret")
        sent = header("p")
        assert (await producer.produce(sent)).status
        frame, _ = await receiver.receive(Cmd.BYTES_MESSAGE)
        # Another connection of the same group answers with the delivery's opaque.
        other = await RawPeer.login(broker.address, "c", "c-secret")
        ack = pb.DeliverAck(messageId=sent.messageId, topic="t", messageType="x", groupId="p", status=True)
        await other.send(frame.opaque, Cmd.DELIVER_ACK, ack)
        heartbeat_opaque = other.next_opaque()
        await other.send(heartbeat_opaque, Cmd.HEARTBEAT, pb.HeartBeat(version=1))
        await other.receive(Cmd.HEARTBEAT)  # the broker has read the foreign ack by now
        assert broker.events.total("acked") == 0
        await receiver.send(frame.opaque, Cmd.DELIVER_ACK, ack)
        await wait_until(lambda: broker.events.total("acked") == 1, what="the real ack")


async def test_kiteq_go_client_conversation_still_works_with_auth(tmp_path: Path) -> None:
    """The frames KiteQ's Go client sends: its own group in every header, a decision with
    opaque 0 after the local transaction, the back-scan answered under the question's
    opaque, and DeliverAcks carrying the publisher's group."""
    async with running_broker(
        tmp_path, auth=SECRETS, tx={"tx_check_after": 0.0, "tx_scan_interval": 0.1}
    ) as broker:
        await bind_direct(broker, "c")
        consumer = await RawPeer.login(broker.address, "c", "c-secret")
        producer = await RawPeer.login(broker.address, "p", "p-secret")
        plain, committed, asked = header("p"), header("p", commit=False), header("p", commit=False)
        for message_header in (plain, committed):
            assert (await producer.produce(message_header)).status
        await producer.send(0, Cmd.TX_ACK, decision(committed, TxStatus.COMMIT))
        assert (await producer.produce(asked)).status
        frame, question = await producer.receive(Cmd.TX_ACK)
        assert question.status == TxStatus.UNKNOWN and question.header.messageId == asked.messageId
        await producer.send(frame.opaque, Cmd.TX_ACK, decision(question.header, TxStatus.COMMIT))
        delivered = set()
        while len(delivered) < 3:
            frame, message = await consumer.receive(Cmd.BYTES_MESSAGE)
            delivered.add(message.header.messageId)
            ack = pb.DeliverAck(
                messageId=message.header.messageId, topic="t", messageType="x", groupId="p", status=True
            )
            await consumer.send(frame.opaque, Cmd.DELIVER_ACK, ack)
        assert delivered == {plain.messageId, committed.messageId, asked.messageId}
        await wait_until(lambda: broker.events.total("acked") == 3, what="three acks")
        assert broker.refusals.totals == {}


async def test_acl_limits_what_a_group_publishes_and_what_it_is_delivered(tmp_path: Path) -> None:
    configure_logging("info")
    acl = {"p": {"publish": ["trade", "refund*"]}, "c": {"subscribe": ["refund*"]}}
    async with running_broker(
        tmp_path, auth=SECRETS, acl=acl, server={"topics": ["trade", "refund-a", "other"]}
    ) as broker:
        producer = await RawPeer.login(broker.address, "p", "p-secret")
        assert (await producer.produce(header("p", topic="trade"))).status
        refused = await producer.produce(header("p", topic="other"))
        assert not refused.status and "may not publish to topic 'other'" in refused.feedback

        with structlog.testing.capture_logs() as logs:
            await broker.registry.put_bindings("c", "trade", [Binding.direct("trade", "x")])
            await wait_until(lambda: len(broker.denied_bindings) == 1, what="the denied binding")
        await bind_direct(broker, "c", topic="refund-a")
        assert [b.topic for b in broker.router.bindings] == ["refund-a"]
        assert any(entry["event"] == "acl.binding_denied" for entry in logs)
        stats = await broker.stats()
        assert stats["security"]["denied_bindings"] == [{"group": "c", "topic": "trade", "message_type": "x"}]

        consumer = await RawPeer.login(broker.address, "c", "c-secret")
        assert (await producer.produce(header("p", topic="trade"))).status
        allowed = header("p", topic="refund-a")
        assert (await producer.produce(allowed)).status
        _, message = await consumer.receive(Cmd.BYTES_MESSAGE)
        assert message.header.messageId == allowed.messageId, "nothing of 'trade' reaches c"
