"""A consumer process for kill tests: prints `ready`, then `acked <id>` per message it acks."""

from __future__ import annotations

import argparse
import sys

import trio

from kiteq import Binding, Consumer, Message, MessageListener
from kiteq.logging import configure_logging


class Printer(MessageListener):
    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def on_message(self, message: Message) -> bool:
        await trio.sleep(self.delay)
        print(f"acked {message.message_id}", flush=True)
        return True


async def main(args: argparse.Namespace) -> None:
    binding = Binding.direct(args.topic, args.type, watermark=args.watermark)
    async with Consumer(
        args.registry, group=args.group, secret=args.secret, bindings=[binding], listener=Printer(args.delay)
    ):
        print("ready", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--registry", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--secret", default="")
    parser.add_argument("--topic", default="t")
    parser.add_argument("--type", default="x")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--watermark", type=int, default=100)
    parser.add_argument("--delivery-log")
    configure_logging("warning")
    trio.run(main, parser.parse_args(sys.argv[1:]))
