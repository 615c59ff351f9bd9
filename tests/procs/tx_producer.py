"""A transactional producer process for kill tests.

`--send N`: sends N transactional messages, prints `stored <id>` after each store ack,
then hangs inside the local transaction until killed (SIGKILL between ack and decision).
`--answer commit|rollback|unknown`: sends nothing; answers the broker's checks and
prints `checked <id>` for each.
"""

from __future__ import annotations

import argparse
import sys

import trio

from kiteq import CheckMessageListener, Message, Producer, TxStatus
from kiteq.logging import configure_logging


class Answer(CheckMessageListener):
    def __init__(self, status: TxStatus) -> None:
        self.status = status

    async def check(self, message: Message) -> TxStatus:
        print(f"checked {message.message_id}", flush=True)
        return self.status


async def main(args: argparse.Namespace) -> None:
    listener = Answer(TxStatus[args.answer.upper()]) if args.answer else None
    async with Producer(
        args.registry, group=args.group, topics=[args.topic], check_listener=listener
    ) as producer:
        print("ready", flush=True)
        stored = trio.Event()

        async def hang(message: Message) -> bool:
            print(f"stored {message.message_id}", flush=True)
            stored.set()
            await trio.sleep_forever()
            return True

        async with trio.open_nursery() as nursery:
            for _ in range(args.send):
                stored = trio.Event()
                nursery.start_soon(producer.send_tx, Message(args.topic, "x", b"tx"), hang)
                await stored.wait()
            await trio.sleep_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--registry", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", default="t")
    parser.add_argument("--send", type=int, default=0)
    parser.add_argument("--answer", choices=["commit", "rollback", "unknown"])
    configure_logging("warning")
    trio.run(main, parser.parse_args(sys.argv[1:]))
