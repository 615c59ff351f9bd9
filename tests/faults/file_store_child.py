"""A process that works on a file store until it is killed: the other half of the crash tests.

    python -m tests.faults.file_store_child DIR fill N     save N messages, print `saved ID` each, then `done`
    python -m tests.faults.file_store_child DIR chaos SEED  run workers forever (below), after `ready`

Store options come as JSON in the KITEQ_STORE_OPTIONS environment variable.

fill: every third message is saved uncommitted and then committed, so the log has
records too. chaos: eight workers each walk new ids through save -> commit or
rollback -> dead-letter -> redrive or purge -> finish, choosing at random, and print
`intent OP ID ARGS…` before each call and `acked OP ID RESULT` after it returns. Lines are
flushed one by one, so whatever the parent read was said before the kill.
"""

from __future__ import annotations

import json
import os
import random
import sys
import uuid
from pathlib import Path

import trio

from kiteq.logging import configure_logging
from stores import MessageEntity
from stores.file import FileStore

BODY = b"b" * 1000


def say(*words: object) -> None:
    sys.stdout.write(" ".join(str(word) for word in words) + "\n")
    sys.stdout.flush()


def entity(message_id: str, commit: bool) -> MessageEntity:
    return MessageEntity(message_id, "trade", "pay", "order-svc", BODY, commit=commit, created_at=1.0)


async def fill(store: FileStore, count: int) -> None:
    for i in range(count):
        message_id = uuid.uuid4().hex
        await store.save(entity(message_id, commit=i % 3 != 0))
        if i % 3 == 0:
            await store.commit(message_id)
        say("saved", message_id)
    say("done")
    await trio.sleep_forever()


async def call(store: FileStore, op: str, message_id: str, *args: object) -> bool:
    say("intent", op, message_id, *args)
    if op == "save":
        result = await store.save(entity(message_id, commit=bool(args[0])))
    else:
        result = await getattr(store, op)(message_id, *args)
    say("acked", op, message_id, int(result))
    return result


async def worker(store: FileStore, rng: random.Random, prefix: str) -> None:
    for n in range(10**9):
        message_id = f"{prefix}{n:024x}"
        commit = rng.random() < 0.5
        await call(store, "save", message_id, commit)
        if not commit:
            if rng.random() < 0.3:
                await call(store, "rollback", message_id)
                continue
            await call(store, "commit", message_id)
        if rng.random() < 0.4:
            await call(store, "dead_letter", message_id, "expired")
            if rng.random() < 0.5:
                await call(store, "purge", message_id)
                continue
            await call(store, "redrive", message_id)
        if rng.random() < 0.5:
            await call(store, "finish", message_id)


async def main(directory: Path, mode: str, arg: int) -> None:
    configure_logging("warning")
    options = json.loads(os.environ.get("KITEQ_STORE_OPTIONS", "{}"))
    async with FileStore.from_uri(f"file://{directory}", **options) as store:
        if mode == "fill":
            await fill(store, arg)
        say("ready")
        async with trio.open_nursery() as nursery:
            for w in range(8):
                nursery.start_soon(worker, store, random.Random(arg * 100 + w), f"{arg:04x}{w:04x}")


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
