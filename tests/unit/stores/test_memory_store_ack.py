"""The memory store's store-ack comes after the tasks ready to run (stores/idle.py)."""

from __future__ import annotations

import uuid

import trio

from stores import MessageEntity
from stores.memory import MemoryStore
from tests.helpers import yields_in


def message() -> MessageEntity:
    return MessageEntity(uuid.uuid4().hex, "trade", "pay", "order-svc", b"x" * 100, created_at=1.0)


async def test_a_lone_save_is_acked_without_a_turn_of_the_event_loop() -> None:
    staged = await MemoryStore().stage_many([message()])
    assert staged.saved == [True]
    assert await yields_in(staged.durable) == 0


async def test_the_tasks_ready_to_run_go_before_the_store_ack() -> None:
    store = MemoryStore()
    ran: list[str] = []

    async def delivery() -> None:
        ran.append("delivery")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(delivery)
        staged = await store.stage_many([message()])
        assert not ran, "the delivery has not run yet"
        await staged.durable()
        assert ran == ["delivery"], "it ran before the ack"


async def test_a_loop_kept_busy_holds_the_store_ack_back_for_a_moment_only() -> None:
    store = MemoryStore()
    async with trio.open_nursery() as nursery:

        async def busy() -> None:  # always ready to run: the loop never goes idle
            while True:
                await trio.lowlevel.checkpoint()

        nursery.start_soon(busy)
        await trio.lowlevel.checkpoint()
        staged = await store.stage_many([message()])
        with trio.fail_after(5):  # bounded by idle.IDLE_GRACE, not by the busy task
            await staged.durable()
        nursery.cancel_scope.cancel()
