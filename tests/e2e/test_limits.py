"""Limits answer bad peers with clear errors and keep the broker serving everyone else."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
import structlog.testing
import trio

from kiteq import Message, Producer, SendError
from kiteq.logging import configure_logging
from protocol import Cmd, encode_frame, encode_raw_frame, pb
from protocol.framing import HEADER
from tests import wire
from tests.helpers import bind_direct, registry_uri, running_broker


async def read_all(stream: trio.SocketStream, timeout: float = 5.0) -> bytes:
    data = b""
    with trio.fail_after(timeout):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def connect(address: str, group: str = "g", secret: str = "") -> trio.SocketStream:
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(encode_frame(1, Cmd.CONN_META, pb.ConnMeta(groupId=group, secretKey=secret)))
    return stream


async def test_oversized_frame_closes_the_connection(tmp_path: Path) -> None:
    async with running_broker(tmp_path, server={"max_frame_bytes": 4096}) as broker:
        stream = await connect(broker.address)
        await stream.send_all(HEADER.pack(2, Cmd.BYTES_MESSAGE, 0, 0, 4097))
        data = await read_all(stream)
        assert len(data) > 0, "the auth ack came back before the broker closed the stream"
        assert not broker.connections or all(c.framed.closed for c in broker.connections)


async def test_body_over_the_limit_is_refused_by_the_client_path(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with (
        running_broker(tmp_path, server={"max_frame_bytes": 4096, "topics": ["t"]}),
        Producer(registry, group="p", topics=["t"], send_timeout=2) as producer,
    ):
        with pytest.raises(SendError):
            await producer.send(Message("t", "x", b"x" * 8192))


async def test_long_header_fields_are_refused_with_a_reason(tmp_path: Path) -> None:
    registry = registry_uri(tmp_path)
    async with (
        running_broker(tmp_path, server={"topics": ["t"]}),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        with pytest.raises(SendError, match="messageType is longer than 255"):
            await producer.send(Message("t", "x" * 300, b""))
        with pytest.raises(SendError, match="more than 64 properties"):
            await producer.send(Message("t", "x", b"", properties={str(i): "v" for i in range(65)}))


async def test_max_connections(tmp_path: Path) -> None:
    async with running_broker(tmp_path, server={"max_connections": 2}) as broker:
        first, second = await connect(broker.address), await connect(broker.address)
        await trio.sleep(0.2)
        third = await connect(broker.address)
        assert await read_all(third) == b"", "the third connection is closed at once"
        await first.send_all(encode_frame(5, Cmd.HEARTBEAT, pb.HeartBeat(version=1)))
        with trio.fail_after(5):
            assert await first.receive_some(4096)
        for stream in (first, second, third):
            await stream.aclose()


async def test_idle_connection_is_closed(tmp_path: Path) -> None:
    async with running_broker(tmp_path, server={"idle_timeout": 0.5, "handshake_timeout": 0.5}) as broker:
        silent = await connect(broker.address)
        data = await read_all(silent, timeout=5)
        assert data, "auth ack, then closed for idleness"
        host, _, port = broker.address.rpartition(":")
        mute = await trio.open_tcp_stream(host, int(port))
        assert await read_all(mute, timeout=5) == b"", "no handshake within the timeout: closed"


async def test_inflight_requests_per_connection_are_bounded(tmp_path: Path) -> None:
    async with running_broker(tmp_path, server={"max_inflight_per_connection": 4}) as broker:
        saving, most = 0, 0
        save_many = broker.store.save_many

        async def counting_save_many(entities):  # type: ignore[no-untyped-def]
            nonlocal saving, most
            saving += len(entities)
            most = max(most, saving)
            try:
                return await save_many(entities)
            finally:
                saving -= len(entities)

        broker.store.save_many = counting_save_many  # type: ignore[method-assign]
        stream = await connect(broker.address)
        header = pb.Header(
            messageId="",
            topic="t",
            messageType="x",
            expiredTime=-1,
            deliverLimit=100,
            groupId="g",
            commit=True,
            fly=False,
        )
        frames = []
        for i in range(50):
            header.messageId = f"{i:032x}"
            frames.append(encode_frame(100 + i, Cmd.BYTES_MESSAGE, pb.BytesMessage(header=header, body=b"b")))
        await stream.send_all(b"".join(frames))
        acks = 0
        buffer = b""
        with trio.fail_after(10):
            while acks < 51:
                buffer += await stream.receive_some(65536)
                while len(buffer) >= 19:
                    length = int.from_bytes(buffer[15:19], "big")
                    if len(buffer) < 19 + length:
                        break
                    buffer = buffer[19 + length :]
                    acks += 1
        assert (await broker.store.stats()).messages == 50, "all were stored"
        assert most == 4, "sent in one write, they were stored four at a time"
        await stream.aclose()


async def test_each_message_of_one_read_gets_its_own_answer(tmp_path: Path) -> None:
    """Messages that arrive together are stored together, but acked one by one."""
    async with running_broker(tmp_path, server={"topics": ["t"]}) as broker:
        stream = await connect(broker.address)

        def message(opaque: int, message_id: str, message_type: str = "x") -> bytes:
            header = pb.Header(
                messageId=message_id,
                topic="t",
                messageType=message_type,
                expiredTime=-1,
                deliverLimit=100,
                groupId="g",
                commit=True,
                fly=False,
            )
            return encode_frame(opaque, Cmd.BYTES_MESSAGE, pb.BytesMessage(header=header, body=b"b"))

        first, second = "a" * 32, "b" * 32
        await stream.send_all(
            message(10, first) + message(11, "c" * 32, "x" * 300) + message(12, first) + message(13, second)
        )
        acks: dict[int, pb.MessageStoreAck] = {}
        buffer = b""
        with trio.fail_after(10):
            while len(acks) < 4:
                buffer += await stream.receive_some(65536)
                while len(buffer) >= HEADER.size:
                    opaque, cmd, _, _, length = HEADER.unpack_from(buffer)
                    if len(buffer) < HEADER.size + length:
                        break
                    if cmd == Cmd.MESSAGE_STORE_ACK:
                        acks[opaque] = pb.MessageStoreAck.FromString(
                            buffer[HEADER.size : HEADER.size + length]
                        )
                    buffer = buffer[HEADER.size + length :]
        assert {opaque: ack.status for opaque, ack in acks.items()} == {
            10: True,
            11: False,
            12: True,
            13: True,
        }
        assert "messageType is longer than 255" in acks[11].feedback
        assert "duplicate" in acks[12].feedback
        assert acks[13].messageId == second
        assert (await broker.store.stats()).messages == 2
        await stream.aclose()


async def test_strings_that_are_not_utf8_are_refused_with_a_reason(tmp_path: Path) -> None:
    """A header string or a StringMessage body that is not UTF-8 (protobuf reads such a proto2
    string as bytes) is answered with a refusal; the connection and the broker go on."""
    async with running_broker(tmp_path, server={"topics": ["t"]}) as broker:
        peer = await wire.RawPeer.login(broker.address, "g")
        bad_type = pb.BytesMessage(header=wire.header("g", message_type="pay"), body=b"b")
        bad_body = pb.StringMessage(header=wire.header("g", message_type="pay"), body="the body")
        for opaque, cmd, data in (
            (5, Cmd.BYTES_MESSAGE, bad_type.SerializeToString().replace(b"pay", b"p\xffy")),
            (6, Cmd.STRING_MESSAGE, bad_body.SerializeToString().replace(b"the body", b"the b\xf0dy")),
        ):
            await peer.stream.send_all(encode_raw_frame(opaque, cmd, data))
            frame, ack = await peer.receive(Cmd.MESSAGE_STORE_ACK)
            assert (frame.opaque, ack.status) == (opaque, False)
            assert "not UTF-8" in ack.feedback
        assert (await peer.produce(wire.header("g"))).status, "the connection still serves"
        assert (await broker.store.stats()).messages == 1
        await peer.aclose()


async def test_a_nack_whose_feedback_is_not_utf8_is_a_failure_like_any_other(tmp_path: Path) -> None:
    """A DeliverAck's feedback is a consumer's free text (a proto2 string, so any bytes): one
    that is not UTF-8 is read with its bad bytes replaced; the round fails, the message comes
    again, and the connection goes on."""
    async with running_broker(tmp_path, delivery={"retry_base": 0.01, "retry_max": 0.01}) as broker:
        await bind_direct(broker, "c")
        consumer = await wire.RawPeer.login(broker.address, "c")
        producer = await wire.RawPeer.login(broker.address, "p")
        assert (await producer.produce(wire.header("p"))).status
        frame, message = await consumer.receive(Cmd.BYTES_MESSAGE)
        header = message.header
        nack = pb.DeliverAck(
            messageId=header.messageId,
            topic="t",
            messageType="x",
            groupId="p",
            status=False,
            feedback="refused",
        )
        bad = nack.SerializeToString().replace(b"refused", b"ref\xffsed")
        await consumer.stream.send_all(encode_raw_frame(frame.opaque, Cmd.DELIVER_ACK, bad))

        again, message = await consumer.receive(Cmd.BYTES_MESSAGE)
        assert message.header.messageId == header.messageId and again.opaque != frame.opaque
        nack.status, nack.feedback = True, "ok"
        await consumer.send(again.opaque, Cmd.DELIVER_ACK, nack)
        with trio.fail_after(10):  # the ack is taken: the round ends and its outcome is stored
            await broker.dispatcher.drained()
        assert (await broker.store.stats()).messages == 0, "the message is finished"
        await consumer.aclose()
        await producer.aclose()


async def test_auth_failures_are_rate_limited_and_never_log_the_secret(tmp_path: Path) -> None:
    configure_logging("info")  # other tests run CLIs in-process that raise the level
    async with running_broker(tmp_path, auth={"pay": "correct-horse"}) as broker:
        with structlog.testing.capture_logs() as logs:
            answers = []
            for _ in range(14):
                stream = await connect(broker.address, "pay", "battery-staple")
                data = await read_all(stream)
                ack = pb.ConnAuthAck()
                ack.ParseFromString(data[19:])
                answers.append(ack.feedback)
    events = {entry["event"] for entry in logs}
    assert "authentication failed" in answers[0]
    assert any("too many failed authentications" in a for a in answers[10:])
    assert {"auth.refused", "auth.rate_limited"} <= events
    assert all("battery-staple" not in str(entry) and "correct-horse" not in str(entry) for entry in logs)
