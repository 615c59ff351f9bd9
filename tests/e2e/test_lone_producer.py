"""A producer awaiting each store-ack, over raw frames: the broker stores a lone message in
the connection's reader (no task of its own, so no turn of the event loop between the
message and its store-ack); messages that come together still go to a task, so the reader
goes on reading while the store works."""

from __future__ import annotations

from pathlib import Path

import trio

from protocol import Cmd, encode_frame, pb
from tests.helpers import TaskSteps, running_broker
from tests.wire import RawPeer, header


async def test_a_lone_message_is_stored_by_the_reader_and_a_burst_by_a_task(tmp_path: Path) -> None:
    handler_steps = TaskSteps("BrokerConnection._run_bounded")
    async with running_broker(tmp_path) as broker:
        peer = await RawPeer.login(broker.address, "order-svc")
        trio.lowlevel.add_instrument(handler_steps)
        try:
            for _ in range(5):
                ack = await peer.produce(header("order-svc"))
                assert ack.status, ack.feedback
            lone = handler_steps.steps
            burst = [header("order-svc") for _ in range(3)]
            await peer.stream.send_all(
                b"".join(
                    encode_frame(peer.next_opaque(), Cmd.BYTES_MESSAGE, pb.BytesMessage(header=h, body=b"x"))
                    for h in burst
                )
            )
            acks = [(await peer.receive(Cmd.MESSAGE_STORE_ACK))[1] for _ in burst]
        finally:
            trio.lowlevel.remove_instrument(handler_steps)
        stored = [await broker.store.get(h.messageId) for h in burst]
        await peer.aclose()
    assert lone == 0, "a lone message went to a task of its own"
    assert all(ack.status for ack in acks) and all(entity is not None for entity in stored)
    assert handler_steps.steps > 0, "messages read together were stored by a task"


async def test_a_producer_is_told_to_resend_while_the_disk_stalls_and_a_resend_is_stored_once(
    tmp_path: Path,
) -> None:
    async with running_broker(tmp_path, store=f"file://{tmp_path}/store?fsync=batch") as broker:
        writer = broker.store._writer  # type: ignore[attr-defined]
        writer.stall_timeout = 0.2
        peer = await RawPeer.login(broker.address, "order-svc")
        message = header("order-svc")
        writer._io.acquire()  # the disk stalls
        try:
            stalled = await peer.produce(message)
        finally:
            writer._io.release()
        resent = await peer.produce(message)
        stored = await broker.store.get(message.messageId)
        await peer.aclose()
    assert not stalled.status
    assert "has finished no write for" in stalled.feedback and "resend" in stalled.feedback
    assert resent.status and "stored once" in resent.feedback, resent.feedback
    assert stored is not None
