"""The Budget that bounds work a reader hands to tasks (see kiteq.budget)."""

from __future__ import annotations

import trio
import trio.testing

from kiteq.budget import Budget
from tests.helpers import start_waiting


async def test_take_waits_at_the_ceiling_and_give_lets_it_in() -> None:
    budget = Budget(4)
    await budget.take(3)
    async with trio.open_nursery() as nursery:
        taken = start_waiting(nursery, lambda: budget.take(2))
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
    async with trio.open_nursery() as nursery:
        emptied = start_waiting(nursery, budget.wait_empty)
        budget.give(1)
        await trio.testing.wait_all_tasks_blocked()
        assert not emptied.is_set()
        budget.give(1)
        await emptied.wait()
