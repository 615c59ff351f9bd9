"""A store-ack that could go out at once lets the tasks ready to run go first.

The file store writes a lone batch in place (writer.py), and the broker acks what a store
with nothing to sync has saved (kiteq/server/handlers.py), only once no other task is
ready to run, or after IDLE_GRACE. So the deliveries and answers that came in beside a
save run before the producer hears of it, and a producer acked the moment its message is
stored cannot outrun the broker's own work. A consumer that is slow or stuck holds up no
store-ack this way: its lane is full, so nothing of it is ready to run.
"""

from __future__ import annotations

import trio
import trio.testing


def _run_context() -> object:
    """Trio's run context, whose runner holds the run queue; None from a Trio that has none."""
    try:
        from trio._core._run import GLOBAL_RUN_CONTEXT
    except ImportError:
        return None
    return GLOBAL_RUN_CONTEXT


_RUN_CONTEXT = _run_context()

# How long a store-ack waits for the event loop to go idle: while tasks keep the loop busy
# that long, the broker is busy enough for the ack to wait no longer (and the file store's
# writer thread takes the batch).
IDLE_GRACE = 0.001


def others_ready() -> bool:
    """Whether tasks other than the calling one are ready to run.

    Read from Trio's run queue itself. `trio.lowlevel.current_statistics()` has the same
    count, but builds it beside the I/O backend's, a walk over every socket a task waits
    on. Every lone save asked twice, so each connection open on the broker, idle or not,
    slowed every save: with 2,000 idle ones, a producer awaiting each store-ack sent at
    0.6 of the rate, the broker spending twice the CPU per message. A Trio without that
    queue gets the statistics' count.
    """
    queue = getattr(getattr(_RUN_CONTEXT, "runner", None), "runq", None)
    if queue is None:
        return trio.lowlevel.current_statistics().tasks_runnable > 0
    return len(queue) > 0


async def once_others_ran() -> None:
    """Return once no other task is ready to run, or after IDLE_GRACE seconds."""
    with trio.move_on_after(IDLE_GRACE):
        await trio.testing.wait_all_tasks_blocked()


async def after_ready_tasks() -> None:
    """`once_others_ran`, yielding only if other tasks are ready: alone, it costs no turn."""
    if others_ready():
        await once_others_ran()
