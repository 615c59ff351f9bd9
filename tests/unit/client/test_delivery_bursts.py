"""A consumer handed many deliveries in one read wakes its workers one at a time.

A raw broker on loopback sends a whole window of deliveries with one write. Were a
worker woken for each, a listener that never waits would cost a task step per delivery
for workers that find the queue empty; one that waits must still have a worker for
every delivery, so that all of them run at once.
"""

from __future__ import annotations

from pathlib import Path

import trio

from kiteq import Binding, Consumer, Message, MessageListener
from kiteq.registry.file import FileRegistry
from protocol import Cmd, pb
from protocol.framing import FrameDecoder, encode_frame
from tests.helpers import RecordingListener, TaskSteps
from tests.wire import header

WINDOW = 100


class RawBroker:
    """Accepts one consumer, sends it WINDOW deliveries in one write, counts its acks."""

    def __init__(self) -> None:
        self.acked: set[str] = set()
        self.all_acked = trio.Event()

    async def serve(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder(1 << 20)
        while data := await stream.receive_some(1 << 16):
            for frame in decoder.feed(data):
                if frame.cmd is Cmd.CONN_META:
                    accepted = pb.ConnAuthAck(status=True, feedback="ok")
                    deliveries = [
                        encode_frame(
                            index + 1,
                            Cmd.BYTES_MESSAGE,
                            pb.BytesMessage(
                                header=header("order-svc", message_id=f"{index:032x}"), body=b"x"
                            ),
                        )
                        for index in range(WINDOW)
                    ]
                    await stream.send_all(encode_frame(frame.opaque, Cmd.CONN_AUTH_ACK, accepted))
                    await stream.send_all(b"".join(deliveries))
                elif frame.cmd is Cmd.DELIVER_ACK:
                    ack = pb.DeliverAck.FromString(frame.body)
                    assert ack.status, ack.feedback
                    self.acked.add(ack.messageId)
                    if len(self.acked) == WINDOW:
                        self.all_acked.set()


async def _consume(tmp_path: Path, listener: MessageListener, steps: TaskSteps) -> RawBroker:
    """Run a Consumer (max_concurrency WINDOW) against a RawBroker until every delivery is acked."""
    broker = RawBroker()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    registry = FileRegistry(tmp_path / "registry.json")
    await registry.register_server(f"127.0.0.1:{port}", ["t"])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, broker.serve, listeners)
        trio.lowlevel.add_instrument(steps)
        try:
            async with Consumer(
                registry,
                group="g",
                bindings=[Binding.direct("t", "x", watermark=WINDOW)],
                listener=listener,
                max_concurrency=WINDOW,
            ):
                with trio.fail_after(10):
                    await broker.all_acked.wait()
        finally:
            trio.lowlevel.remove_instrument(steps)
        nursery.cancel_scope.cancel()
    return broker


async def test_a_burst_for_a_listener_that_never_waits_costs_a_few_task_steps(tmp_path: Path) -> None:
    listener = RecordingListener()
    steps = TaskSteps("Consumer._work")
    await _consume(tmp_path, listener, steps)
    assert len(listener.acked) == WINDOW
    assert listener.max_running == 1
    # Waking, parking and the cancel at exit included; woken one per delivery it was 201.
    assert steps.steps <= WINDOW // 10, f"{steps.steps} worker steps for one read of {WINDOW} deliveries"


class AllAtOnce(MessageListener):
    """Waits until every delivery of the window is in a listener at the same time."""

    def __init__(self) -> None:
        self.running = 0
        self.everyone_in = trio.Event()

    async def on_message(self, message: Message) -> bool:
        self.running += 1
        if self.running == WINDOW:
            self.everyone_in.set()
        await self.everyone_in.wait()
        return True


async def test_listeners_that_wait_each_get_a_worker(tmp_path: Path) -> None:
    listener = AllAtOnce()
    broker = await _consume(tmp_path, listener, TaskSteps("Consumer._work"))
    assert listener.everyone_in.is_set()
    assert len(broker.acked) == WINDOW
