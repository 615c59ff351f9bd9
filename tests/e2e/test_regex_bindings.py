"""Regex bindings over the wire: matched in linear time (RE2), and refused or skipped when RE2 cannot.

A backtracking engine takes exponential time on `(a+)+` against `aaa…ab`, on the broker's
event loop: every connection waited. These tests send raw frames (tests/wire.py) as
KiteQ's Go client would and time what another connection sees meanwhile.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import httpx
import pytest
import structlog.testing
import trio

from kiteq.registry.bindings import Binding, BindingError
from protocol import Cmd, pb
from tests.helpers import running_broker, wait_until
from tests.wire import RawPeer, header

HEARTBEAT_EVERY = 0.05


async def bound(broker, group: str, topic: str) -> None:  # type: ignore[no-untyped-def]
    await wait_until(
        lambda: any(b.group == group and b.topic == topic for b in broker.router.bindings), what="the binding"
    )


def deliver_ack(message_header: pb.Header, group: str) -> pb.DeliverAck:
    return pb.DeliverAck(
        messageId=message_header.messageId,
        topic=message_header.topic,
        messageType=message_header.messageType,
        groupId=group,
        status=True,
    )


async def heartbeat_waits(peer: RawPeer, stop: trio.Event, waits: list[float]) -> None:
    """Heartbeat every 50 ms; record, per heartbeat, from when it was due until its echo.

    Counted from when it was due, not when it was sent: the test shares the broker's
    event loop, so a stall while this task sleeps delays the send as much as the echo.
    """
    due = trio.current_time()
    while not stop.is_set():
        await trio.sleep_until(due)
        opaque = peer.next_opaque()
        await peer.send(opaque, Cmd.HEARTBEAT, pb.HeartBeat(version=opaque))
        frame, _ = await peer.receive(Cmd.HEARTBEAT, timeout=60)
        assert frame.opaque == opaque
        waits.append(trio.current_time() - due)
        due = trio.current_time() + HEARTBEAT_EVERY


async def test_a_pathological_regex_binding_stalls_nothing(tmp_path: Path) -> None:
    async with running_broker(tmp_path, server={"topics": ["t"]}) as broker:
        await broker.registry.put_bindings("c", "t", [Binding.regex("t", "(a+)+")])
        await bound(broker, "c", "t")
        producer = await RawPeer.login(broker.address, "p")
        consumer = await RawPeer.login(broker.address, "c")
        watcher = await RawPeer.login(broker.address, "w")
        waits: list[float] = []
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(heartbeat_waits, watcher, stop, waits)
            await trio.sleep(5 * HEARTBEAT_EVERY)
            headers = [header("p", topic="t", message_type="a" * n + "b") for n in (26, 27, 28)]
            started = trio.current_time()
            for message_header in headers:
                await producer.send(
                    producer.next_opaque(),
                    Cmd.BYTES_MESSAGE,
                    pb.BytesMessage(header=message_header, body=b"x"),
                )
            acked = set()
            while len(acked) < len(headers):
                _, ack = await producer.receive(Cmd.MESSAGE_STORE_ACK, timeout=60)
                assert ack.status, ack.feedback
                acked.add(ack.messageId)
            ack_time = trio.current_time() - started
            await trio.sleep(5 * HEARTBEAT_EVERY)
            stop.set()
        assert acked == {h.messageId for h in headers}
        assert ack_time < 2.0, f"3 acks took {ack_time:.3f} s"
        assert len(waits) >= 5 and max(waits) < 0.5, f"heartbeat waits (s): {waits}"

        # The pattern still routes what it fully matches, and only that.
        matching = header("p", topic="t", message_type="a" * 30)
        assert (await producer.produce(matching)).status
        frame, delivered = await consumer.receive(Cmd.BYTES_MESSAGE)
        assert delivered.header.messageId == matching.messageId
        await consumer.send(frame.opaque, Cmd.DELIVER_ACK, deliver_ack(delivered.header, "c"))


def test_a_pattern_re2_refuses_is_refused_when_the_binding_is_made() -> None:
    with pytest.raises(BindingError, match=r"invalid regex '\(a\)\\\\1': invalid escape sequence") as refused:
        Binding.regex("t", r"(a)\1")
    assert "RE2 syntax" in str(refused.value)
    with pytest.raises(BindingError, match="invalid perl operator"):
        Binding.regex("t", "pay-(?=succ)")


def write_by_hand(path: Path, topic: str, group: str, bindings: list[dict[str, object]]) -> None:
    """Edit the registry file as another tool would: under its lock, no validation on the way."""
    with open(path.with_name(path.name + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tree = json.loads(path.read_text())
        tree["bindings"].setdefault(topic, {})[group] = bindings
        tmp = path.with_name(".hand-edit.tmp")
        tmp.write_text(json.dumps(tree))
        os.replace(tmp, path)


async def test_a_pattern_re2_refuses_in_the_registry_is_skipped_and_reported(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        await broker.registry.put_bindings("good", "t", [Binding.direct("t", "x")])
        await bound(broker, "good", "t")
        bad = {"groupId": "bad", "topic": "t", "messageType": r"(a)\1", "bindType": 1}
        with structlog.testing.capture_logs() as logs:
            await trio.to_thread.run_sync(write_by_hand, tmp_path / "registry.json", "t", "bad", [bad])
            await wait_until(lambda: broker.router.skipped, what="the bad binding skipped")
            # Another registry change: the skipped binding is not logged again.
            await broker.registry.put_bindings("other", "t", [Binding.direct("t", "y")])
            await bound(broker, "other", "t")
        skipped = [entry for entry in logs if entry["event"] == "routing.binding_skipped"]
        assert len(skipped) == 1, "logged once while it stays"
        assert (skipped[0]["group"], skipped[0]["topic"], skipped[0]["pattern"]) == (
            "'bad'",
            "'t'",
            r"'(a)\\1'",
        )
        assert skipped[0]["reason"] == r"invalid escape sequence: '\\1'"

        stats = (await trio.to_thread.run_sync(httpx.get, f"http://{broker.admin_address}/stats")).json()
        assert stats["routing"]["skipped_bindings"] == [
            {
                "group": "bad",
                "topic": "t",
                "message_type": r"(a)\1",
                "reason": r"invalid escape sequence: '\\1'",
            }
        ]
        assert stats["routing"]["bindings"] == 2

        # The other bindings route as before.
        consumer = await RawPeer.login(broker.address, "good")
        producer = await RawPeer.login(broker.address, "p")
        message = header("p", topic="t", message_type="x")
        assert (await producer.produce(message)).status
        frame, delivered = await consumer.receive(Cmd.BYTES_MESSAGE)
        assert delivered.header.messageId == message.messageId
        await consumer.send(frame.opaque, Cmd.DELIVER_ACK, deliver_ack(delivered.header, "good"))
