"""A send made while earlier ones await their answers is written by the sender's task.

Requests in flight used to count as frames on their way, so a producer keeping a window
of sends (`Producer.pipeline`) sent each through the connection's writer task, a turn of
the event loop after it was made. Only requesters an answer woke and that have not run
yet still hold a send back for the writer (tests/unit/client/test_answer_bursts.py).
"""

from __future__ import annotations

import trio

from protocol import Cmd
from tests.raw_broker import connected_client, numbered_message, silent_broker

SENDS = 5


async def test_each_send_of_a_window_reaches_the_socket_before_the_sender_yields() -> None:
    received: list[int] = []
    all_in = trio.Event()
    async with trio.open_nursery() as nursery:
        connection = await connected_client(
            nursery, lambda stream: silent_broker(stream, received, SENDS, all_in)
        )
        framed = connection.framed
        assert framed is not None
        written = []
        for index in range(SENDS):
            before = framed.bytes_out
            connection.request_nowait(
                Cmd.BYTES_MESSAGE,
                numbered_message(index).SerializeToString(),
                5.0,
                lambda answer, timed_out: None,
            )
            written.append(framed.bytes_out > before)
        assert connection.session.pending == SENDS
        assert written == [True] * SENDS, "each send went to the socket at once, none left for the writer"
        with trio.fail_after(5):
            await all_in.wait()
        nursery.cancel_scope.cancel()
    assert received == sorted(received), "in the order sent"
