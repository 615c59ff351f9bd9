"""The sends that refill a pipeline's reopened window leave together, in one write.

Written one at a time from the sender's task (each finding the connection idle), a
burst of them cost the producer a syscall each and the broker a read each. A send
that finds room without waiting is still written at once (test_sends_in_flight.py).
Waiting for room first (`pipeline.wait_for_room()`, then `send`) changes none of it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing

from kiteq import Message
from kiteq.client.pipeline import SendPipeline
from kiteq.errors import SendError
from protocol import Cmd
from tests.raw_broker import connected_client, numbered_message, silent_broker

OnStored = Callable[[SendError | None], None]


@pytest.mark.parametrize(
    ("window", "sends", "answered_when_full", "at_once"),
    [
        # room all along: every send written at once
        (3, 2, [], [True, True]),
        # the window fills, two answers reopen it: the two sends that refill it wait for the writer
        (3, 5, [2], [True, True, True, False, False]),
        # one answer, then two: each refill as large as what was answered
        (2, 5, [1, 2], [True, True, False, False, False]),
    ],
)
@pytest.mark.parametrize("room_first", [False, True], ids=["send", "wait-then-send"])
async def test_which_sends_are_written_at_once(
    window: int, sends: int, answered_when_full: list[int], at_once: list[bool], room_first: bool
) -> None:
    handed: list[tuple[bool, OnStored]] = []

    async def store(message: Message, compress: bool, on_stored: OnStored, now: bool) -> None:
        handed.append((now, on_stored))

    pipeline = SendPipeline(store, lambda message, error: None, window)
    answers = iter(answered_when_full)
    answered = 0
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def sender() -> None:
            for index in range(sends):
                if room_first:  # the message is built once there is room, then sent
                    await pipeline.wait_for_room()
                    assert pipeline.in_flight < window
                await pipeline.send(Message("t", "x", b"%d" % index))
            done.set()

        nursery.start_soon(sender)
        while True:
            await trio.testing.wait_all_tasks_blocked()
            if done.is_set():
                break
            for _ in range(next(answers)):  # the window is full: answer the oldest sends
                handed[answered][1](None)
                answered += 1
    assert [now for now, _ in handed] == at_once


async def test_sends_left_for_the_writer_go_out_together_once_the_sender_yields() -> None:
    received: list[int] = []
    all_in = trio.Event()
    async with trio.open_nursery() as nursery:
        connection = await connected_client(
            nursery, lambda stream: silent_broker(stream, received, 3, all_in)
        )
        framed = connection.framed
        assert framed is not None
        before = framed.bytes_out
        for index in range(3):
            connection.request_nowait(
                Cmd.BYTES_MESSAGE,
                numbered_message(index).SerializeToString(),
                5.0,
                lambda answer, timed_out: None,
                at_once=False,
            )
        assert framed.bytes_out == before, "none written from the sender's task"
        with trio.fail_after(5):
            await all_in.wait()
        assert framed.bytes_out > before
        nursery.cancel_scope.cancel()
    assert received == sorted(received), "in the order sent"
