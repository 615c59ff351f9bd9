"""Snappy bodies over the wire: KiteQ's Go client on one side, ours on the other, the broker between.

A raw producer (tests/wire.py) sends what the Go client sends with `header.snappy` set
(a block-format body; base64 of one for a StringMessage); a Python Consumer's listener
gets the body decompressed. `send(..., compress=True)` stores exactly the Go client's
bytes, and the broker keeps them untouched.
"""

from __future__ import annotations

import base64
from pathlib import Path

import structlog.testing
import trio

from kiteq import Binding, Consumer, Message, Producer, sync
from protocol import Cmd, pb
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.wire import RawPeer, header

# golang/snappy's Encode of b"A" * 100: "A", then copies of 64 and 35 bytes at offset 1.
A100_BLOCK = b"\x64" + b"\x00A" + b"\xfe\x01\x00" + b"\x8a\x01\x00"
HELLO_BLOCK = b"\x05\x10hello"  # one literal


def snappy_header(message_type: str) -> pb.Header:
    flagged = header("go", topic="t", message_type=message_type)
    flagged.snappy = True
    return flagged


async def test_go_clients_snappy_bodies_reach_the_listener_decompressed(tmp_path: Path) -> None:
    listener = RecordingListener()
    async with (
        running_broker(tmp_path) as broker,
        Consumer(registry_uri(tmp_path), group="c", bindings=[Binding.fanout("t")], listener=listener),
    ):
        go = await RawPeer.login(broker.address, "go")
        ack = await go.produce(snappy_header("bytes"), A100_BLOCK)
        assert ack.status, ack.feedback
        opaque = go.next_opaque()
        text = pb.StringMessage(header=snappy_header("string"), body=base64.b64encode(HELLO_BLOCK).decode())
        await go.send(opaque, Cmd.STRING_MESSAGE, text)
        _, ack = await go.receive(Cmd.MESSAGE_STORE_ACK)
        assert ack.status, ack.feedback
        with structlog.testing.capture_logs() as logs:
            assert (await go.produce(snappy_header("corrupt"), b"\xffnot snappy")).status
            await wait_until(lambda: len(listener.deliveries) == 3, what="three deliveries")

    received = {m.message_type: m for m in listener.deliveries}
    assert (received["bytes"].body, received["bytes"].snappy) == (b"A" * 100, False)
    assert (received["string"].body, received["string"].snappy) == ("hello", False)
    # As KiteQ's Go consumer does: a body that does not decompress is handed over as it came.
    assert (received["corrupt"].body, received["corrupt"].snappy) == (b"\xffnot snappy", True)
    assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] == [
        "consumer.body_not_decompressed"
    ]


async def test_send_compress_stores_the_go_clients_bytes_and_consumers_get_the_original(
    tmp_path: Path,
) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path) as broker,
        Consumer(registry, group="c", bindings=[Binding.fanout("t")], listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
    ):
        # A persistent group with no consumer online: the broker keeps every message, to look at.
        await broker.registry.put_bindings("keeper", "t", [Binding.fanout("t")])
        await wait_until(lambda: len(broker.router.bindings) == 2, what="the keeper's binding")
        message = Message("t", "bytes", b"A" * 100)
        bytes_id = await producer.send(message, compress=True)
        assert (message.body, message.snappy) == (b"A" * 100, False), "the caller's message is left alone"
        string_id = await producer.send_string("t", "string", "hello", compress=True)

        def blocking() -> str:
            with sync.Producer(registry, group="p", topics=["t"]) as blocking_producer:
                return blocking_producer.send(Message("t", "sync", "héllo " * 20), compress=True)

        sync_id = await trio.to_thread.run_sync(blocking)
        await wait_until(lambda: len(listener.acked_ids) == 3, what="three deliveries")

        stored_bytes, stored_string = await broker.store.get(bytes_id), await broker.store.get(string_id)
        assert stored_bytes is not None and (stored_bytes.body, stored_bytes.snappy) == (A100_BLOCK, True)
        assert stored_string is not None and stored_string.body == base64.b64encode(
            HELLO_BLOCK
        )  # UTF-8 of it

    received = {m.message_id: m for m in listener.deliveries}
    assert (received[bytes_id].body, received[bytes_id].snappy) == (b"A" * 100, False)
    assert (received[string_id].body, received[string_id].snappy) == ("hello", False)
    assert (received[sync_id].body, received[sync_id].snappy) == ("héllo " * 20, False)
