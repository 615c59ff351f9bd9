"""Exactly-once effects on top of at-least-once delivery: skip message ids already processed.

Delivery is at least once: an ack lost to a crash or a closed connection brings the
message back. IdempotentListener records each processed message id in a table
(SQLAlchemy Core; SQLite by default, any SQLAlchemy URL) and acks a message whose
id is already there without running the handler again. All database calls run in
worker threads (`trio.to_thread`), never on the Trio loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import Enum

import structlog
import trio
from sqlalchemy import Column, Connection, Engine, Float, MetaData, String, Table, create_engine
from sqlalchemy.exc import IntegrityError

from kiteq.client.listeners import MessageListener
from kiteq.client.message import Message

log = structlog.get_logger(__name__)

TransactionalHandler = Callable[[Message, Connection], object]

DEFAULT_DATABASE = "sqlite:///kiteq-processed.sqlite"


class _Outcome(Enum):
    DONE = "done"  # the handler ran and its writes committed with the id: ack
    DUPLICATE = "duplicate"  # the id was already recorded: ack without running
    DECLINED = "declined"  # the handler returned False: all rolled back, nack


class _Rollback(Exception):
    def __init__(self, outcome: _Outcome) -> None:
        self.outcome = outcome


class IdempotentListener(MessageListener):
    """Runs a handler at most once per message id; ids live in `table` in `database`.

    Two forms:

    * `IdempotentListener(handler)` with a plain `handler(message, connection) -> bool`:
      exactly-once effects. In a worker thread, one transaction first inserts the id,
      then runs the handler with that connection; the handler's writes and the id
      commit together. A unique-key violation on the insert means another delivery
      already committed: ack without running. False or raising rolls everything back
      and nacks, so the broker redelivers. Inserting first also makes a concurrent
      duplicate wait on the row lock instead of running twice.
    * `IdempotentListener(listener)` with an async MessageListener: the id is
      recorded in its own transaction after the listener acks. Redeliveries after
      that are skipped, but a crash between the listener's work and the record can
      still repeat the work: prefer the first form when the effect is in a database.

    `scope` separates listeners sharing one table (use the consumer group).
    """

    def __init__(
        self,
        handler: TransactionalHandler | MessageListener,
        database: str | Engine = DEFAULT_DATABASE,
        *,
        table: str = "kiteq_processed",
        scope: str = "",
    ) -> None:
        self.handler = handler
        self.engine = create_engine(database) if isinstance(database, str) else database
        self.scope = scope
        self.table = Table(
            table,
            MetaData(),
            Column("scope", String(255), primary_key=True),
            Column("message_id", String(32), primary_key=True),
            Column("processed_at", Float, nullable=False, index=True),
        )
        self.processed = 0
        self.skipped = 0
        self._created = False
        self._create_lock = threading.Lock()

    async def on_message(self, message: Message) -> bool:
        if not self._created:
            await trio.to_thread.run_sync(self._create_table)
        if isinstance(self.handler, MessageListener):
            return await self._around_listener(self.handler, message)
        outcome = await trio.to_thread.run_sync(self._in_transaction, self.handler, message)
        if outcome is _Outcome.DUPLICATE:
            self._skip(message)
        elif outcome is _Outcome.DONE:
            self.processed += 1
        return outcome is not _Outcome.DECLINED

    def _create_table(self) -> None:
        with self._create_lock:
            if not self._created:
                self.table.create(self.engine, checkfirst=True)
                self._created = True

    def _row(self, message: Message) -> dict[str, object]:
        return {"scope": self.scope, "message_id": message.message_id, "processed_at": time.time()}

    def _in_transaction(self, handler: TransactionalHandler, message: Message) -> _Outcome:
        """Runs in a worker thread; counters are kept by the caller, on the Trio thread."""
        try:
            with self.engine.begin() as connection:
                try:
                    connection.execute(self.table.insert(), self._row(message))
                except IntegrityError:
                    raise _Rollback(_Outcome.DUPLICATE) from None
                if not handler(message, connection):
                    raise _Rollback(_Outcome.DECLINED)
        except _Rollback as rollback:
            return rollback.outcome
        return _Outcome.DONE

    async def _around_listener(self, listener: MessageListener, message: Message) -> bool:
        if await trio.to_thread.run_sync(self.seen, message.message_id):
            self._skip(message)
            return True
        if not await listener.on_message(message):
            return False
        await trio.to_thread.run_sync(self._record, message)
        self.processed += 1
        return True

    def _record(self, message: Message) -> None:
        try:
            with self.engine.begin() as connection:
                connection.execute(self.table.insert(), self._row(message))
        except IntegrityError:
            log.info(
                "idempotent.raced", message_id=message.message_id, detail="a concurrent delivery ran too"
            )

    def _skip(self, message: Message) -> None:
        self.skipped += 1
        log.info(
            "idempotent.skipped",
            message_id=message.message_id,
            attempt=message.deliver_count,
            scope=self.scope,
        )

    def seen(self, message_id: str) -> bool:
        """Whether `message_id` was processed (blocking; call it from a thread in async code)."""
        self._create_table()
        query = self.table.select().where(
            self.table.c.scope == self.scope, self.table.c.message_id == message_id
        )
        with self.engine.connect() as connection:
            return connection.execute(query).first() is not None

    def prune(self, older_than: float) -> int:
        """Forget ids processed more than `older_than` seconds ago; how many (blocking).

        Safe once no redelivery can come: past the messages' expiry, at most 7 days
        after they were sent (the broker's limit).
        """
        self._create_table()
        cutoff = time.time() - older_than
        query = self.table.delete().where(
            self.table.c.scope == self.scope, self.table.c.processed_at < cutoff
        )
        with self.engine.begin() as connection:
            return connection.execute(query).rowcount
