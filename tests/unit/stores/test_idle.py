"""A store-ack that could go out at once lets the tasks ready to run go first (stores/idle.py)."""

from __future__ import annotations

from typing import NoReturn

import pytest
import trio
import trio.testing

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


def _statistics_say() -> bool:
    return trio.lowlevel.current_statistics().tasks_runnable > 0


def _walked() -> NoReturn:
    raise AssertionError("asked trio.lowlevel.current_statistics(), which walks every socket")


@pytest.mark.parametrize("read_from", ["the run queue", "the statistics"])
async def test_it_sees_what_trios_statistics_see(monkeypatch: pytest.MonkeyPatch, read_from: str) -> None:
    if read_from == "the statistics":  # a Trio whose runner keeps no `runq`
        monkeypatch.setattr(idle, "_RUN_CONTEXT", None)
    seen = [(idle.others_ready(), _statistics_say())]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep_forever)
        seen.append((idle.others_ready(), _statistics_say()))
        await trio.testing.wait_all_tasks_blocked()
        seen.append((idle.others_ready(), _statistics_say()))
        nursery.cancel_scope.cancel()
    assert seen == [(False, False), (True, True), (False, False)]


async def test_it_reads_the_run_queue_without_walking_every_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trio's statistics count the tasks waiting on each socket too: with 2,000 idle
    connections open, every lone save asking them cut the rate of sends awaiting their
    store-acks to 0.6."""
    monkeypatch.setattr(trio.lowlevel, "current_statistics", _walked)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep_forever)
        assert idle.others_ready()
        await trio.testing.wait_all_tasks_blocked()
        assert not idle.others_ready()
        nursery.cancel_scope.cancel()
