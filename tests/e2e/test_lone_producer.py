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
