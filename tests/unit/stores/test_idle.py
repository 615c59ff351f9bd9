"""A store-ack that could go out at once lets the tasks ready to run go first (stores/idle.py)."""

from __future__ import annotations

import trio

from stores import idle
from tests.helpers import yields_in


async def test_alone_it_costs_no_turn_of_the_event_loop() -> None:
    assert not idle.others_ready()
    assert await yields_in(idle.after_ready_tasks) == 0


async def test_the_tasks_ready_to_run_go_first() -> None:
    ran: list[str] = []

    async def delivery() -> None:
        ran.append("delivery")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(delivery)
        assert idle.others_ready() and not ran
        await idle.after_ready_tasks()
        assert ran == ["delivery"], "it ran before the ack"


async def test_a_loop_kept_busy_holds_the_ack_back_for_a_moment_only() -> None:
    async with trio.open_nursery() as nursery:

        async def busy() -> None:  # always ready to run: the loop never goes idle
            while True:
                await trio.lowlevel.checkpoint()

        nursery.start_soon(busy)
        with trio.fail_after(5):  # bounded by IDLE_GRACE, not by the busy task
            await idle.once_others_ran()
        nursery.cancel_scope.cancel()
