"""Consume `trade/pay-succ` messages from the broker started by `make run`.

.venv/bin/python examples/consumer.py            # Ctrl-C to stop

It leaves its group bound to trade/pay-succ on purpose (a persistent binding: messages
sent while no consumer of the group runs wait for it, and the binding is what makes a
broker serve `trade`). To remove it:

    .venv/bin/kiteq-admin --registry file://./data/registry.json bindings remove --group sms-svc --topic trade
"""

from __future__ import annotations

import argparse

import trio

from kiteq import Binding, Consumer, Message, MessageListener
from kiteq.logging import configure_logging

LEFT_BEHIND = (
    "left group {group!r} bound to trade/pay-succ (messages wait for it); remove with:\n"
    "  kiteq-admin --registry {registry} bindings remove --group {group} --topic trade"
)


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
    # Ctrl-C: Trio raises KeyboardInterrupt in whatever runs when it comes, a task of the
    # client's included, and then it comes out inside an exception group.
    try:
        trio.run(main, args.registry, args.group, args.tls_ca)
    except* KeyboardInterrupt:
        pass
    print(LEFT_BEHIND.format(group=args.group, registry=args.registry), flush=True)
