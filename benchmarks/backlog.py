"""A million-message backlog on KiteQ-py alone: building it, holding it, draining it.

The versus_rabbitmq suite compares a 55,000-message backlog with RabbitMQ's; this one
asks whether the cost of a backlog depends on its size. On one kiteq-server (file
store, `fsync=batch`, the bound group persistent with watermark 100), with the
versus_rabbitmq suite's clients (1 KiB messages, 100 sends in flight):

1. backlog send: `messages` sends while the bound group is offline; the rate over the
   whole run and over its first and last tenth (their ratio says whether the rate
   holds as the backlog grows; that figure's params hold every tenth's rate, which
   tells a steady fall from a dip), and the broker's resident memory per stored message;
2. idle: nothing connected, the backlog stored, broker CPU over two windows of 30 s. The
   first holds work the sends left behind: the recover loop, idle, looks every 30 s at
   most, and its first look after the sends moves the messages stored since its last one
   from the schedule's timers into the due index (a sort, about a second per 300,000
   messages). The second window is the broker holding the backlog and nothing else;
3. drain: one consumer joins and takes the whole backlog;
4. end to end, unthrottled: 50,000 messages with the consumer online, the rate the
   drain is compared with.

One run (a million messages take minutes); `--messages N` sets the backlog.
"""

from __future__ import annotations

import time
from typing import cast

from benchmarks import versus_rabbitmq as versus
from benchmarks.clients.workload import BODY
from benchmarks.harness import Figure, Report
from tests.procs.memory import memory_of

SUITE = "backlog"
IDLE_SECONDS = 30.0  # the recover loop's longest wait (MAX_IDLE)
END_TO_END = 50_000


def run(quick: bool, messages: int | None = None) -> list[Figure]:
    backlog = messages or (20_000 if quick else 1_000_000)
    idle = 2.0 if quick else IDLE_SECONDS
    with versus._kiteq() as side:
        rss_before = memory_of(side.pid)[0]
        with versus.Usage(side.pid) as sending:
            sent = versus._report(versus._client(side, "produce", backlog))
        rss_per_message = (memory_of(side.pid)[0] - rss_before) / backlog
        idling = []
        for _ in range(2):
            with versus.Usage(side.pid) as window:
                time.sleep(idle)
            idling.append(window.cpu / idle)
        with versus.Usage(side.pid) as draining:
            drained = versus._report(versus._subscribed(side, backlog))
        end_to_end: list[Report] = versus._end_to_end(side, min(END_TO_END, backlog), "--first", str(backlog))
    conditions: dict[str, object] = {"backlog": backlog, "window": versus.WINDOW, "body": BODY}
    idle_conditions = conditions | {"window_seconds": idle}
    e2e_rate = end_to_end[-1]["end_to_end_rate"]
    return [
        Figure(SUITE, "backlog send", sent["rate"], "msgs/s", conditions),
        Figure(SUITE, "backlog send, first tenth", sent["first_tenth_rate"], "msgs/s", conditions),
        Figure(SUITE, "backlog send, last tenth", sent["last_tenth_rate"], "msgs/s", conditions),
        Figure(
            SUITE,
            "backlog send, last tenth / first tenth",
            sent["last_tenth_rate"] / sent["first_tenth_rate"],
            "ratio",
            conditions | {"tenth_rates": [round(rate) for rate in cast("list[float]", sent["tenth_rates"])]},
        ),
        Figure(SUITE, "backlog send: broker CPU", sending.cpu, "s", conditions),
        Figure(SUITE, "broker RSS per stored message", rss_per_message, "bytes", conditions),
        Figure(
            SUITE,
            "idle with backlog, first window: broker CPU per second",
            idling[0],
            "cores",
            idle_conditions,
        ),
        Figure(
            SUITE,
            "idle with backlog, second window: broker CPU per second",
            idling[1],
            "cores",
            idle_conditions,
        ),
        Figure(SUITE, "drain", drained["rate"], "msgs/s", conditions),
        Figure(SUITE, "drain: broker CPU", draining.cpu, "s", conditions),
        Figure(SUITE, "end to end (after the drain)", e2e_rate, "msgs/s", conditions),
        Figure(SUITE, "drain / end to end", drained["rate"] / e2e_rate, "ratio", conditions),
    ]
