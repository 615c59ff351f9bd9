"""Exactly-once effects on top of at-least-once delivery: each deposit counts once.

Consumes `bank/deposit` messages (body: an amount) and adds each to an account
balance in SQLite through IdempotentListener: the balance update and the message
id commit in one transaction, so a redelivered deposit is acked without being
applied again. `--lose-first-ack` makes every first delivery fail right *after*
its transaction committed (a crash before the ack): the broker delivers every
deposit twice, and the balance still counts each once.

    .venv/bin/python examples/idempotent_consumer.py --send 5 --lose-first-ack
    .venv/bin/python examples/idempotent_consumer.py            # Ctrl-C to stop

It leaves the balance and the processed ids in `--database` (./data/bank.sqlite: a second
run adds to the balance; delete the file to start at 0) and the persistent `bank-svc`
binding to bank/deposit, so deposits sent while it is stopped wait for it. To remove it:

    .venv/bin/kiteq-admin --registry file://./data/registry.json bindings remove --group bank-svc --topic bank
"""

from __future__ import annotations

import argparse
from pathlib import Path

import trio
from sqlalchemy import Column, Connection, Engine, Integer, MetaData, String, Table, create_engine, select

from kiteq import Binding, Consumer, Message, MessageListener, Producer
from kiteq.client.idempotent import IdempotentListener
from kiteq.logging import configure_logging

metadata = MetaData()
accounts = Table("accounts", metadata, Column("id", String(32), primary_key=True), Column("balance", Integer))


def deposit(message: Message, connection: Connection) -> bool:
    """Not idempotent on its own: applying it twice would count the money twice."""
    amount = int(message.body)
    connection.execute(
        accounts.update().where(accounts.c.id == "main").values(balance=accounts.c.balance + amount)
    )
    print(f"applied {message.message_id} +{amount} (delivery #{message.deliver_count})", flush=True)
    return True


class LoseFirstAck(MessageListener):
    """Simulates a consumer that crashes after committing, before its ack reaches the broker."""

    def __init__(self, inner: MessageListener) -> None:
        self.inner = inner

    async def on_message(self, message: Message) -> bool:
        ok = await self.inner.on_message(message)
        if message.deliver_count == 1:
            raise RuntimeError("crashed after commit, before the ack")
        return ok


def open_bank(path: Path) -> Engine:
    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine)
    with engine.begin() as connection:
        if connection.execute(select(accounts.c.id)).first() is None:
            connection.execute(accounts.insert(), {"id": "main", "balance": 0})
    return engine


def balance(engine: Engine) -> int:
    with engine.connect() as connection:
        return connection.execute(select(accounts.c.balance).where(accounts.c.id == "main")).scalar_one()


async def main(registry: str, database: Path, send: int, lose_first_ack: bool, tls: str | None) -> None:
    engine = await trio.to_thread.run_sync(open_bank, database)
    idempotent = IdempotentListener(deposit, engine, scope="bank-svc")
    listener = LoseFirstAck(idempotent) if lose_first_ack else idempotent
    bindings = [Binding.direct("bank", "deposit")]
    async with Consumer(
        registry, group="bank-svc", bindings=bindings, listener=listener, tls=tls
    ) as consumer:
        print(f"consuming bank/deposit; balance {await trio.to_thread.run_sync(balance, engine)}", flush=True)
        if not send:
            await trio.sleep_forever()
        async with Producer(registry, group="teller", topics=["bank"], tls=tls) as producer:
            for amount in range(1, send + 1):
                await producer.send_string("bank", "deposit", str(amount))
        with trio.fail_after(60):
            while consumer.acked < send:
                await trio.sleep(0.05)
    total = await trio.to_thread.run_sync(balance, engine)
    print(
        f"balance {total} after {idempotent.processed + idempotent.skipped} deliveries "
        f"of {send} deposits ({idempotent.skipped} duplicates skipped)",
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--registry", default="file://./data/registry.json")
    parser.add_argument(
        "--tls-ca", help="the CA file of a TLS broker's certificate (kiteq-server --tls-cert)"
    )
    parser.add_argument("--database", type=Path, default=Path("./data/bank.sqlite"))
    parser.add_argument(
        "--send", type=int, default=0, help="send deposits of 1..N, then stop once all are acked"
    )
    parser.add_argument(
        "--lose-first-ack", action="store_true", help="fail every first delivery after commit"
    )
    args = parser.parse_args()
    args.database.parent.mkdir(parents=True, exist_ok=True)
    configure_logging("error")
    # Ctrl-C: Trio raises KeyboardInterrupt in whatever runs when it comes, a task of the
    # client's included, and then it comes out inside an exception group.
    try:
        trio.run(main, args.registry, args.database, args.send, args.lose_first_ack, args.tls_ca)
    except* KeyboardInterrupt:
        pass
    print(
        f"left the balance in {args.database} (delete it to start at 0) and group bank-svc bound "
        f"to bank/deposit; remove with:\n  kiteq-admin --registry {args.registry} bindings remove "
        "--group bank-svc --topic bank",
        flush=True,
    )
