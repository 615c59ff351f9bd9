"""Consume `trade/pay-succ` with the blocking API: a plain function, run in worker threads.

.venv/bin/python examples/sync_consumer.py            # Ctrl-C stops gracefully
.venv/bin/python examples/sync_consumer.py --count 5  # stop after five messages

It leaves its group bound to trade/pay-succ on purpose (a persistent binding: messages
sent while no consumer of the group runs wait for it, and the binding is what makes a
broker serve `trade`). To remove it:

    .venv/bin/kiteq-admin --registry file://./data/registry.json bindings remove --group sms-svc --topic trade
"""

from __future__ import annotations

import argparse
import contextlib
import threading

from kiteq import Binding, Message, sync
from kiteq.logging import configure_logging

LEFT_BEHIND = (
    "left group {group!r} bound to trade/pay-succ (messages wait for it); remove with:\n"
    "  kiteq-admin --registry {registry} bindings remove --group {group} --topic trade"
)


def main(registry: str, group: str, count: int, tls: str | None) -> None:
    enough = threading.Event()
    lock = threading.Lock()
    received = 0

    def handle(message: Message) -> bool:
        """Runs in a worker thread (up to max_concurrency at once): guard shared state."""
        nonlocal received
        print(
            f"received {message.message_id} {message.topic}/{message.message_type} "
            f"delivery #{message.deliver_count}: {message.body!r}",
            flush=True,
        )
        with lock:
            received += 1
            if count and received >= count:
                enough.set()
        return True  # ack; False (or an exception) asks the broker to deliver it again later

    bindings = [Binding.direct("trade", "pay-succ", watermark=100)]
    with sync.Consumer(
        registry, group=group, bindings=bindings, listener=handle, max_concurrency=8, tls=tls
    ) as consumer:
        print(f"consumer group {group!r} bound to trade/pay-succ; waiting for messages", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            enough.wait()
        # Leaving the block closes gracefully: running handlers finish and their acks are sent.
    print(f"stopped after acking {consumer.acked} messages", flush=True)
    print(LEFT_BEHIND.format(group=group, registry=registry), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--registry", default="file://./data/registry.json")
    parser.add_argument(
        "--tls-ca", help="the CA file of a TLS broker's certificate (kiteq-server --tls-cert)"
    )
    parser.add_argument("--group", default="sms-svc")
    parser.add_argument(
        "--count", type=int, default=0, help="stop after this many messages (0: run until Ctrl-C)"
    )
    args = parser.parse_args()
    configure_logging("warning")
    main(args.registry, args.group, args.count, args.tls_ca)
