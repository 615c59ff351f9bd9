"""Consume `trade/pay-succ` messages from the broker started by `make run`.

.venv/bin/python examples/consumer.py            # Ctrl-C to stop
"""

from __future__ import annotations

import argparse
import contextlib

import trio

from kiteq import Binding, Consumer, Message, MessageListener
from kiteq.logging import configure_logging


class PrintingListener(MessageListener):
    async def on_message(self, message: Message) -> bool:
        print(
            f"received {message.message_id} {message.topic}/{message.message_type} "
            f"delivery #{message.deliver_count}: {message.body!r}",
            flush=True,
        )
        return True  # ack; False (or an exception) asks the broker to deliver it again later


async def main(registry: str, group: str, tls: str | None) -> None:
    bindings = [Binding.direct("trade", "pay-succ", watermark=100)]
    async with Consumer(registry, group=group, bindings=bindings, listener=PrintingListener(), tls=tls):
        print(f"consumer group {group!r} bound to trade/pay-succ; waiting for messages", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--registry", default="file://./data/registry.json")
    parser.add_argument(
        "--tls-ca", help="the CA file of a TLS broker's certificate (kiteq-server --tls-cert)"
    )
    parser.add_argument("--group", default="sms-svc")
    args = parser.parse_args()
    configure_logging("warning")
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(main, args.registry, args.group, args.tls_ca)
