"""Transactional send: the order row and the message commit together, or neither does.

The pattern to copy: the local transaction writes the order *and* remembers the
message id in the same SQLite transaction; the CheckMessageListener answers the
broker's question ("did that transaction commit?") from that table, so a producer
that crashed between its commit and telling the broker is still answered right by
the next instance of the group.

    .venv/bin/python examples/tx_producer.py --orders 3 [--fail-every 2]

Each run places new orders, numbered on from the table's last one. The table stays in
`--database` (./data/orders.sqlite by default): delete the file to start over.
"""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

import trio

from kiteq import CheckMessageListener, Message, Producer, TxStatus
from kiteq.logging import configure_logging

SCHEMA = "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, amount INTEGER, message_id TEXT UNIQUE)"


class OrderTable:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path)
        self.db.execute(SCHEMA)

    def place(self, order_id: int, amount: int, message_id: str, fail: bool) -> bool:
        """The local transaction: insert the order with the message id, commit or roll back."""
        try:
            with self.db:
                self.db.execute(
                    "INSERT INTO orders (id, amount, message_id) VALUES (?, ?, ?)",
                    (order_id, amount, message_id),
                )
                if fail:
                    raise RuntimeError(f"payment for order {order_id} declined")
            return True
        except (sqlite3.Error, RuntimeError) as exc:
            print(f"order {order_id} rolled back: {exc}", flush=True)
            return False

    def next_order_id(self) -> int:
        """Fresh ids for this run: a second run must not collide with the first's orders."""
        (last,) = self.db.execute("SELECT COALESCE(MAX(id), 0) FROM orders").fetchone()
        return int(last) + 1

    def count(self) -> int:
        (rows,) = self.db.execute("SELECT COUNT(*) FROM orders").fetchone()
        return int(rows)

    def committed(self, message_id: str) -> bool:
        return (
            self.db.execute("SELECT 1 FROM orders WHERE message_id = ?", (message_id,)).fetchone() is not None
        )


class OrderCheck(CheckMessageListener):
    """Answers the broker's back-scan from the orders table."""

    def __init__(self, orders: OrderTable) -> None:
        self.orders = orders

    async def check(self, message: Message) -> TxStatus:
        return TxStatus.COMMIT if self.orders.committed(message.message_id) else TxStatus.ROLLBACK


async def main(registry: str, database: Path, count: int, fail_every: int, tls: str | None) -> None:
    orders = OrderTable(database)
    first = orders.next_order_id()
    async with Producer(
        registry, group="order-svc", topics=["trade"], check_listener=OrderCheck(orders), tls=tls
    ) as producer:
        for n in range(1, count + 1):
            order_id = first + n - 1
            fail = fail_every > 0 and n % fail_every == 0
            message = Message("trade", "pay-succ", f"order {order_id} paid".encode())

            async def local_tx(msg: Message, order_id: int = order_id, fail: bool = fail) -> bool:
                return orders.place(order_id, 100 * order_id, msg.message_id, fail)

            status = await producer.send_tx(message, local_tx)
            print(f"order {order_id}: {status.name} {message.message_id}", flush=True)
    print(f"{orders.count()} orders kept in {database} (delete it to start over)", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--registry", default="file://./data/registry.json")
    parser.add_argument(
        "--tls-ca", help="the CA file of a TLS broker's certificate (kiteq-server --tls-cert)"
    )
    parser.add_argument("--database", type=Path, default=Path("./data/orders.sqlite"))
    parser.add_argument("--orders", type=int, default=3)
    parser.add_argument("--fail-every", type=int, default=0, help="make every Nth local transaction fail")
    args = parser.parse_args()
    args.database.parent.mkdir(parents=True, exist_ok=True)
    configure_logging("warning")
    trio.run(main, args.registry, args.database, args.orders, args.fail_every, args.tls_ca)
