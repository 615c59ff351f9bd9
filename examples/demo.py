"""Broker, consumer and producer in one process: the whole path in a few seconds.

.venv/bin/python examples/demo.py

Its broker keeps the store and registry in a temporary directory, removed at the end.
"""

from __future__ import annotations

import tempfile

import trio

from kiteq import Binding, Consumer, Message, MessageListener, Producer
from kiteq.config import load_config
from kiteq.logging import configure_logging
from kiteq.server.broker import Broker

COUNT = 10


class Collector(MessageListener):
    def __init__(self) -> None:
        self.received: list[Message] = []

    async def on_message(self, message: Message) -> bool:
        self.received.append(message)
        print(f"delivered to sms-svc: {message.body!r}", flush=True)
        return True


async def main(workdir: str) -> None:
    registry = f"file://{workdir}/registry.json?poll=0.1"
    config = load_config(
        None,
        {
            "server": {
                "bind": "127.0.0.1:0",
                "admin_bind": "",
                "registry": registry,
                "store": f"file://{workdir}/store",
            }
        },
    )
    broker = Broker(config)
    collector = Collector()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(broker.run)
        print(f"broker listening on {address}, store {config.server.store}", flush=True)
        bindings = [Binding.direct("trade", "pay-succ")]
        async with Consumer(registry, group="sms-svc", bindings=bindings, listener=collector):
            async with Producer(registry, group="order-svc", topics=["trade"]) as producer:
                for i in range(COUNT):
                    await producer.send(Message("trade", "pay-succ", f"order {i} paid".encode()))
            with trio.fail_after(10):
                while len(collector.received) < COUNT:
                    await trio.sleep(0.05)
        print(f"demo done: {len(collector.received)} of {COUNT} messages delivered", flush=True)
        broker.stop()


if __name__ == "__main__":
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="kiteq-demo-") as workdir:
        trio.run(main, workdir)
    print(f"removed {workdir}", flush=True)
