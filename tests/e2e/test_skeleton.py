"""End to end on loopback: routing to direct/regex/fanout groups, retries, auth, bad frames."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from kiteq import AuthError, Binding, Consumer, Message, Producer, SendError
from kiteq.client.connection import ClientConnection, Credentials
from protocol import Cmd, encode_frame, pb
from protocol.wire import WireAck
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.procs.broker import server_command
from tests.services.ports import free_port, stop_process, wait_for_port


async def test_thousand_messages_reach_exactly_the_bound_groups(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    direct, regex, fanout = RecordingListener(), RecordingListener(), RecordingListener()
    async with (
        running_broker(tmp_path) as broker,
        Consumer(registry, group="direct", bindings=[Binding.direct("trade", "pay-succ")], listener=direct),
        Consumer(registry, group="regex", bindings=[Binding.regex("trade", "pay-.*")], listener=regex),
        Consumer(registry, group="fanout", bindings=[Binding.fanout("user")], listener=fanout),
    ):
        await wait_until(lambda: len(broker.router.bindings) == 3, what="bindings at the broker")
        sent: dict[tuple[str, str], set[str]] = {}
        async with Producer(registry, group="order-svc", topics=["trade", "user"]) as producer:
            kinds = [("trade", "pay-succ"), ("trade", "pay-fail"), ("trade", "refund"), ("user", "signup")]
            for i in range(1000):
                topic, message_type = kinds[i % len(kinds)]
                body = f"body-{i}" if i % 2 else f"body-{i}".encode()
                message_id = await producer.send(Message(topic, message_type, body))
                sent.setdefault((topic, message_type), set()).add(message_id)
        expected = {
            "direct": sent[("trade", "pay-succ")],
            "regex": sent[("trade", "pay-succ")] | sent[("trade", "pay-fail")],
            "fanout": sent[("user", "signup")],
        }
        listeners = {"direct": direct, "regex": regex, "fanout": fanout}
        await wait_until(
            lambda: all(listeners[g].acked_ids == ids for g, ids in expected.items()),
            what="every bound group to ack its messages",
        )
        for group, listener in listeners.items():
            assert {m.message_id for m in listener.deliveries} == expected[group], group
        await wait_until(lambda: broker.events.total("finished") == 750, what="messages finished")
        stats = await broker.store.stats()
        assert stats.messages == 250, "refund messages match no binding and stay for retry"
    bodies = {m.body for m in fanout.deliveries}
    assert all(isinstance(b, str) for b in bodies) or all(isinstance(b, bytes) for b in bodies) or bodies


async def test_string_and_bytes_bodies_arrive_intact(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path),
        Consumer(registry, group="c", bindings=[Binding.fanout("t")], listener=listener),
    ):
        async with Producer(registry, group="p", topics=["t"]) as producer:
            await producer.send(Message("t", "a", "héllo wörld", properties={"k": "v"}))
            await producer.send(Message("t", "b", b"\x00\x01\xff"))
        await wait_until(lambda: len(listener.acked) == 2)
    by_type = {m.message_type: m for m in listener.deliveries}
    assert by_type["a"].body == "héllo wörld" and by_type["a"].properties == {"k": "v"}
    assert by_type["b"].body == b"\x00\x01\xff"
    assert by_type["a"].deliver_count == 1 and by_type["a"].group == "p"


async def test_listener_returning_false_gets_the_message_again(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener(fail=lambda m: m.deliver_count < 2)
    delivery = {"retry_base": 0.05, "retry_jitter": "none", "recover_interval": 0.05}
    async with (
        running_broker(tmp_path, delivery=delivery),
        Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener),
    ):
        async with Producer(registry, group="p", topics=["t"]) as producer:
            message_id = await producer.send(Message("t", "x", b"retry me"))
        await wait_until(lambda: listener.acked[message_id] == 1, what="the retried message to be acked")
    counts = [m.deliver_count for m in listener.deliveries if m.message_id == message_id]
    assert counts == [1, 2]


async def test_wrong_secret_is_refused_with_a_reason(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path, auth={"order-svc": "s3cret"}, server={"topics": ["t"]}):
        async with Producer(registry, group="order-svc", secret="s3cret", topics=["t"]) as producer:
            assert producer.pool.live("t"), "the right secret connects"
        with pytest.raises(AuthError, match="authentication failed for group 'order-svc'"):
            async with Producer(registry, group="order-svc", secret="wrong", topics=["t"], connect_timeout=3):
                pass


async def test_malformed_frame_closes_only_that_connection(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with running_broker(tmp_path, server={"topics": ["t"]}) as broker:
        host, _, port = broker.address.rpartition(":")
        async with Producer(registry, group="p", topics=["t"]) as producer:
            bad = await trio.open_tcp_stream(host, int(port))
            await bad.send_all(encode_frame(1, Cmd.CONN_META, pb.ConnMeta(groupId="evil", secretKey="")))
            await bad.send_all(b"\x00\x00\x00\x02\x7f" + bytes(14))  # unknown command 0x7f
            data = b""
            with trio.fail_after(5):
                while chunk := await bad.receive_some(4096):
                    data += chunk
            assert data, "the auth ack arrived, then the broker closed the stream"
            await producer.send(Message("t", "x", b"still fine"))
            await bad.aclose()


async def test_message_before_auth_is_refused(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        host, _, port = broker.address.rpartition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        message = pb.BytesMessage(
            header=pb.Header(
                messageId="a" * 32,
                topic="t",
                messageType="x",
                expiredTime=-1,
                deliverLimit=100,
                groupId="g",
                commit=True,
                fly=False,
            ),
            body=b"",
        )
        await stream.send_all(encode_frame(9, Cmd.BYTES_MESSAGE, message))
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(4096):
                data += chunk
        ack = pb.ConnAuthAck()
        ack.ParseFromString(data[19:])
        assert not ack.status and "Unauthorized" in ack.feedback
        assert (await broker.store.stats()).messages == 0


async def test_bad_message_is_refused_with_status_false(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with (
        running_broker(tmp_path, server={"topics": ["t"]}),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        with pytest.raises(SendError, match="Invalid MessageId"):
            await producer.send(Message("t", "x", b"", message_id="not-a-uuid"))
        connection = producer.pool.live("t")[0]
        ack = await connection.request(Cmd.BYTES_MESSAGE, pb.HeartBeat(version=1).SerializeToString(), 5)
        assert isinstance(ack, WireAck) and not ack.status and "bad message" in ack.feedback
        await producer.send(Message("t", "x", b"the connection survived"))


async def test_same_message_id_twice_is_stored_once(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with (
        running_broker(tmp_path, server={"topics": ["t"]}) as broker,
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        message = Message("t", "x", b"once")
        await producer.send(message)
        await producer.send(message)
        assert broker.events.total("stored") == 1


async def test_heartbeat_is_echoed(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker:
        connection = ClientConnection(broker.address, Credentials("g", ""))
        async with trio.open_nursery() as nursery:
            await nursery.start(connection.run)
            answer = await connection.request(
                Cmd.HEARTBEAT, pb.HeartBeat(version=12345).SerializeToString(), 5
            )
            assert answer == pb.HeartBeat(version=12345)
            nursery.cancel_scope.cancel()


async def test_kiteq_server_subprocess_serves_clients(tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    registry = registry_uri(tmp_path)
    command = server_command(
        f"127.0.0.1:{port}", f"file://{tmp_path}/store", registry, admin=f"127.0.0.1:{admin}"
    )
    proc = subprocess.Popen(
        command, cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stderr=subprocess.PIPE
    )
    try:
        await trio.to_thread.run_sync(wait_for_port, port)
        listener = RecordingListener()
        async with Consumer(registry, group="c", bindings=[Binding.direct("t", "x")], listener=listener):
            async with Producer(registry, group="p", topics=["t"]) as producer:
                ids = {await producer.send(Message("t", "x", f"m{i}".encode())) for i in range(50)}
            await wait_until(lambda: listener.acked_ids == ids, what="deliveries from the subprocess broker")
    finally:
        stop_process(proc)
    assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""


def test_kiteq_server_reports_a_bad_config_value(tmp_path: Path) -> None:
    config = tmp_path / "kiteq.toml"
    config.write_text('[delivery]\nretry_base = "soon"\n')
    result = subprocess.run(
        [sys.executable, "-m", "kiteq.cli.server", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "[delivery] retry_base: expected float" in result.stderr
