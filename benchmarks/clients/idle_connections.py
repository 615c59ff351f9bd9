"""Connections that authenticate, then only answer heartbeats, in a process of their own.

`python -m benchmarks.clients.idle_connections ADDRESS COUNT` opens COUNT connections to
the broker at ADDRESS as group `idle`, prints `ready` once all are open, and holds them
until killed: the crowd of idle clients in `end_to_end`'s `file-batch+idle-connections`.
They open evenly over one heartbeat interval, so their heartbeats come as independent
clients' would, spread out, not all in one burst every interval.
"""

from __future__ import annotations

import argparse

import trio

from kiteq.client.connection import HEARTBEAT_INTERVAL, ClientConnection, Credentials
from kiteq.logging import configure_logging


async def hold(address: str, count: int) -> None:
    async with trio.open_nursery() as nursery:
        started = trio.current_time()
        for index in range(count):
            await trio.sleep_until(started + index * HEARTBEAT_INTERVAL / count)
            await nursery.start(ClientConnection(address, Credentials("idle", "")).run)
        print("ready", flush=True)
        await trio.sleep_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("address", help="the broker's host:port")
    parser.add_argument("count", type=int, help="connections to hold open")
    args = parser.parse_args()
    configure_logging("warning")
    trio.run(hold, args.address, args.count)


if __name__ == "__main__":
    main()
