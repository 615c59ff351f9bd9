"""The Budget that bounds work a reader hands to tasks (see kiteq.budget)."""

from __future__ import annotations

import trio
import trio.testing

from kiteq.budget import Budget


async def test_take_waits_at_the_ceiling_and_give_lets_it_in() -> None:
    budget = Budget(4)
    await budget.take(3)
    taken = trio.Event()

    async def take_two() -> None:
        await budget.take(2)
        taken.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take_two)
        await trio.testing.wait_all_tasks_blocked()
        assert not taken.is_set(), "3 + 2 is over the ceiling of 4"
        budget.give(2)
        await taken.wait()
    assert budget.used == 3


async def test_anything_fits_while_nothing_is_in_use() -> None:
    budget = Budget(2)
    with trio.fail_after(1):
        await budget.take(10)
    assert budget.used == 10


async def test_wait_empty_returns_once_everything_is_given_back() -> None:
    budget = Budget(8)
    await budget.take(2)
    emptied = trio.Event()

    async def wait() -> None:
        await budget.wait_empty()
        emptied.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        budget.give(1)
        await trio.testing.wait_all_tasks_blocked()
        assert not emptied.is_set()
        budget.give(1)
        await emptied.wait()
