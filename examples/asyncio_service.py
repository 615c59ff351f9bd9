"""An asyncio service using KiteQ through the blocking API (kiteq.sync).

It consumes `trade/pay-succ`, does its own async work for each payment, then sends
a `trade/receipt` message. The two directions between asyncio and kiteq.sync:

* asyncio → KiteQ: blocking calls go through `asyncio.to_thread`, so the event
  loop never waits on a broker.
* KiteQ → asyncio: the sync Consumer calls its listener in a worker thread; the
  listener hands the message to the event loop with `run_coroutine_threadsafe`
  and returns the coroutine's answer as the ack.

    .venv/bin/python examples/asyncio_service.py            # Ctrl-C stops gracefully
    .venv/bin/python examples/asyncio_service.py --count 3  # stop after three payments

It leaves nothing behind: at exit it removes its `receipt-svc` binding, so payments sent
while it is down are not kept for it. A real service that must not miss any keeps its
(persistent) binding instead, and its group's backlog waits for it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from functools import partial

import trio

from kiteq import Binding, Message, sync
from kiteq.logging import configure_logging
from kiteq.registry import open_registry

GROUP = "receipt-svc"
PAYMENTS = Binding.direct("trade", "pay-succ")


async def unbind(registry_uri: str) -> int:
    """Remove the service's binding (Trio code: the registry API is async, in Trio)."""
    async with open_registry(registry_uri) as registry:
        return await registry.remove_binding(GROUP, PAYMENTS.topic, PAYMENTS.message_type)


async def main(registry: str, count: int, tls: str | None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    handled = 0
    # The consumer starts first: its binding is what makes a broker serve `trade`.
    connected: asyncio.Future[sync.Producer] = loop.create_future()

    async def handle(message: Message) -> bool:
        nonlocal handled
        producer = await connected
        await asyncio.sleep(0.01)  # stands for the service's own async I/O (HTTP, database…)
        receipt_id = await asyncio.to_thread(
            producer.send_string,
            "trade",
            "receipt",
            f"receipt for {message.body!r}",
            properties={"payment": message.message_id},
        )
        handled += 1
        print(f"handled {message.message_id} -> receipt {receipt_id}", flush=True)
        if count and handled >= count:
            stop.set()
        return True

    def on_message(message: Message) -> bool:
        """Runs in a consumer worker thread: wait for the event loop to handle the message."""
        return asyncio.run_coroutine_threadsafe(handle(message), loop).result()

    consumer = await asyncio.to_thread(
        partial(
            sync.Consumer,
            registry,
            group=GROUP,
            bindings=[PAYMENTS],
            listener=on_message,
            message_timeout=30,
            tls=tls,
        )
    )
    # Its own group: the broker delivers a group's messages on any of its connections.
    producer = await asyncio.to_thread(
        partial(sync.Producer, registry, group="receipt-out", topics=["trade"], tls=tls)
    )
    connected.set_result(producer)
    print("receipt service ready", flush=True)
    try:
        await stop.wait()
    finally:
        # Close while the event loop still runs: in-flight handlers need it to finish.
        await asyncio.to_thread(consumer.close)
        await asyncio.to_thread(producer.close)
        # A worker thread runs the Trio call, as kiteq.sync does for every other one.
        removed = await asyncio.to_thread(trio.run, unbind, registry)
    print(
        f"asyncio service done: {handled} payments handled; {removed} binding of {GROUP} removed", flush=True
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--registry", default="file://./data/registry.json")
    parser.add_argument(
        "--tls-ca", help="the CA file of a TLS broker's certificate (kiteq-server --tls-cert)"
    )
    parser.add_argument(
        "--count", type=int, default=0, help="stop after this many payments (0: run until Ctrl-C)"
    )
    args = parser.parse_args()
    configure_logging("warning")
    asyncio.run(main(args.registry, args.count, args.tls_ca))
