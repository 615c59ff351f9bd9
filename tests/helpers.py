"""Shared test harness: an in-process broker on free ports, recording listeners, event-loop instruments."""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from kiteq import Message, MessageListener
from kiteq.config import load_config
from kiteq.registry.bindings import Binding
from kiteq.server.broker import Broker

FAST_POLL = 0.05

InstrumentT = TypeVar("InstrumentT", bound=trio.abc.Instrument)


def registry_uri(tmp_path: Path) -> str:
    return f"file://{tmp_path}/registry.json?poll={FAST_POLL}"


def broker_config(
    tmp_path: Path,
    *,
    store: str = "memory://",
    auth: dict[str, str] | None = None,
    **sections: dict[str, Any],
):  # type: ignore[no-untyped-def]
    server = {
        "bind": "127.0.0.1:0",
        "admin_bind": "127.0.0.1:0",
        "store": store,
        "registry": registry_uri(tmp_path),
    }
    server.update(sections.pop("server", {}))
    config = load_config(None, {"server": server, **sections})
    config.auth = dict(auth or {})
    return config


@contextlib.asynccontextmanager
async def running_broker(tmp_path: Path, **options: Any) -> AsyncIterator[Broker]:
    """A broker serving on 127.0.0.1 (free port) for the duration of the block."""
    broker = Broker(broker_config(tmp_path, **options))
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        yield broker
        broker.stop()


class RecordingListener(MessageListener):
    """Records every delivery; `fail(message)` decides a nack; `delay` slows it down."""

    def __init__(self, fail: Callable[[Message], bool] | None = None, delay: float = 0.0) -> None:
        self.fail = fail or (lambda message: False)
        self.delay = delay
        self.deliveries: list[Message] = []
        self.acked: Counter[str] = Counter()
        self.times: dict[str, list[float]] = defaultdict(list)
        self.running = 0
        self.max_running = 0

    async def on_message(self, message: Message) -> bool:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            self.deliveries.append(message)
            self.times[message.message_id].append(trio.current_time())
            if self.delay:
                await trio.sleep(self.delay)
            if self.fail(message):
                return False
            self.acked[message.message_id] += 1
            return True
        finally:
            self.running -= 1

    @property
    def acked_ids(self) -> set[str]:
        return set(self.acked)


def start_waiting(nursery: trio.Nursery, wait: Callable[[], Awaitable[object]]) -> trio.Event:
    """Run `wait()` in a task of `nursery`; the event returned is set once it has returned."""
    returned = trio.Event()

    async def run() -> None:
        await wait()
        returned.set()

    nursery.start_soon(run)
    return returned


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll `predicate` until true; fail the test with `what` after `timeout` seconds."""
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def bind_direct(broker: Broker, group: str, topic: str = "t", message_type: str = "x") -> None:
    """Bind `group` to `topic`/`message_type` in the broker's registry; return once its router has it."""
    await broker.registry.put_bindings(group, topic, [Binding.direct(topic, message_type)])
    await wait_until(
        lambda: any(b.group == group and b.topic == topic for b in broker.router.bindings), what="the binding"
    )


class TaskSteps(trio.abc.Instrument):
    """Counts the steps (runs until the next await) of the tasks running `function`, and
    records what `observe` returns before each of them (in `seen`), when given.

    `function` is a qualified name (`FramedStream.write_loop`). Trio names a task after its
    function's module and qualified name, or, for a method compiled with mypyc (which has
    no `__module__`), after the bound method's repr: both mention the qualified name.
    """

    def __init__(self, function: str, observe: Callable[[], int] | None = None) -> None:
        self.function = function
        self.observe = observe
        self.steps = 0
        self.seen: list[int] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.function in task.name:
            self.steps += 1
            if self.observe is not None:
                self.seen.append(self.observe())


async def instrumented(instrument: InstrumentT, run: Callable[[], Awaitable[None]]) -> InstrumentT:
    """`instrument` after watching the event loop while `run()` is awaited."""
    trio.lowlevel.add_instrument(instrument)
    try:
        await run()
    finally:
        trio.lowlevel.remove_instrument(instrument)
    return instrument


class Yields(trio.abc.Instrument):
    """Counts how often `task` is resumed: once per time it yielded to the event loop."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


async def yields_in(wait: Callable[[], Awaitable[None]]) -> int:
    """How often the calling task yields while awaiting `wait()`."""
    return (await instrumented(Yields(trio.lowlevel.current_task()), wait)).count
