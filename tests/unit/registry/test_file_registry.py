"""The file registry: the same interface as ZooKeeper's, in one JSON file, watched by polling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from kiteq.errors import RegistryError
from kiteq.registry import Binding, BindingError, open_registry
from kiteq.registry.file import FileRegistry


def file_registry(path: Path) -> FileRegistry:
    registry = open_registry(f"file://{path}?poll=0.05")
    assert isinstance(registry, FileRegistry)
    return registry


async def wait_for(values: list[Any], expected: Any, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not values or values[-1] != expected:
            await trio.sleep(0.02)


async def test_servers_producers_and_bindings(tmp_path: Path) -> None:
    async with file_registry(tmp_path / "registry.json") as registry:
        await registry.register_server("h1:1", ["trade", "order"])
        await registry.register_server("h1:1", ["trade"])
        await registry.register_server("h2:1", ["trade"])
        assert await registry.list_servers() == {"trade": ["h1:1", "h2:1"]}
        await registry.unregister_server("h1:1")
        assert await registry.list_servers("trade") == {"trade": ["h2:1"]}
        await registry.register_producer("p:1", "order-svc", ["trade"])
        assert await registry.list_producers() == {"trade": {"order-svc": ["p:1"]}}

        await registry.add_binding(Binding.direct("trade", "pay-succ", group="sms"))
        with pytest.raises(BindingError):
            await registry.add_binding(Binding.fanout("trade", group="sms"))
        await registry.put_bindings("mail", "trade", [Binding.fanout("trade")])
        assert [b.key for b in await registry.list_bindings("trade")] == [
            ("mail", "trade", "*"),
            ("sms", "trade", "pay-succ"),
        ]
        assert await registry.remove_binding("sms", "trade", "nope") == 0
        assert await registry.remove_binding("sms", "trade") == 1
        assert await registry.list_bindings(group="sms") == []


async def test_watches_poll_for_changes_made_by_others(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    bindings: list[list[Binding]] = []
    servers: list[list[str]] = []
    async with file_registry(path) as watcher, file_registry(path) as writer, trio.open_nursery() as nursery:
        await nursery.start(watcher.watch_bindings, bindings.append)
        await nursery.start(watcher.watch_servers, "trade", servers.append)
        assert bindings == [[]] and servers == [[]]

        binding = Binding.direct("trade", "pay-succ", group="sms")
        await writer.add_binding(binding)
        await wait_for(bindings, [binding])
        await writer.register_server("h1:1", ["trade"])
        await wait_for(servers, ["h1:1"])

        # A broken hand edit keeps the last good value; fixing it is seen.
        good = path.read_text()
        path.write_text("{ not json")
        await trio.sleep(0.2)
        assert bindings[-1] == [binding]
        path.write_text(good)
        await writer.remove_binding("sms", "trade")
        await wait_for(bindings, [])
        nursery.cancel_scope.cancel()


async def test_concurrent_writers_lose_no_update(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    async with file_registry(path) as one, file_registry(path) as two, trio.open_nursery() as nursery:
        for i in range(15):
            nursery.start_soon(one.add_binding, Binding.direct("trade", f"a{i}", group="g"))
            nursery.start_soon(two.add_binding, Binding.direct("trade", f"b{i}", group="g"))
            nursery.start_soon(two.register_server, f"h{i}:1", ["trade"])
    async with file_registry(path) as registry:
        assert len(await registry.list_bindings("trade", "g")) == 30
        assert len((await registry.list_servers())["trade"]) == 15


async def test_a_broken_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    for content in ("{ not json", "[1, 2]"):
        path.write_text(content)
        with pytest.raises(RegistryError, match="registry file"):
            await file_registry(path).start()


async def test_producers_are_withdrawn_on_close_and_bounded_per_group(tmp_path: Path) -> None:
    from kiteq.registry.file import MAX_PRODUCERS

    path = tmp_path / "registry.json"
    async with file_registry(path) as closing:
        await closing.register_producer("clean:1", "order-svc", ["trade"])
    async with file_registry(path) as registry:
        assert await registry.list_producers() == {"trade": {"order-svc": []}}, "a closed producer withdrew"
        killed = [f"killed:{i}" for i in range(MAX_PRODUCERS + 10)]  # registered, never closed
        for address in killed:
            await registry.register_producer(address, "order-svc", ["trade"])
        assert (await registry.list_producers())["trade"]["order-svc"] == killed[-MAX_PRODUCERS:]
        registry._producers.clear()  # as if this process were killed: nothing withdrawn
