"""Send a few `trade/pay-succ` messages to the broker started by `make run`.

.venv/bin/python examples/producer.py --count 10
"""

from __future__ import annotations

import argparse

import trio

from kiteq import Message, Producer
from kiteq.logging import configure_logging


async def main(registry: str, count: int, tls: str | None) -> None:
    async with Producer(registry, group="order-svc", topics=["trade"], tls=tls) as producer:
        for i in range(count):
            message_id = await producer.send(Message("trade", "pay-succ", f"order {i} paid".encode()))
            print(f"stored {message_id}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--registry", default="file://./data/registry.json")
    parser.add_argument(
        "--tls-ca", help="the CA file of a TLS broker's certificate (kiteq-server --tls-cert)"
    )
    parser.add_argument("--count", type=int, default=5)
    args = parser.parse_args()
    configure_logging("warning")
    trio.run(main, args.registry, args.count, args.tls_ca)
